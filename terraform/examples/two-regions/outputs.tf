output "catalogue_yaml" {
  description = "The catalogue every signaling front loads; keep it for `rtcedge-cloudflare sync`."
  value       = local.catalogue_yaml
}

output "session_apis" {
  description = "In-cluster session API URL of each region's cluster."
  value = {
    "eu-central" = module.region_eu_central.session_api
    "us-east"    = module.region_us_east.session_api
  }
}

output "relay_vips" {
  description = "VIP (address:port) of each POP."
  value = {
    fra = module.pop_fra.vip
    iad = module.pop_iad.vip
  }
}

output "load_balancer_id" {
  description = "The signaling load balancer."
  value       = module.steering.load_balancer_id
}
