output "namespace" {
  description = "Namespace of the POP."
  value       = local.namespace
}

output "vip_address" {
  description = "Public address of the relay VIP (the cloud load balancer's IP, or its hostname when it has no IP)."
  value = try(
    kubernetes_service_v1.vip.status[0].load_balancer[0].ingress[0].ip,
    kubernetes_service_v1.vip.status[0].load_balancer[0].ingress[0].hostname,
    null,
  )
}

output "vip" {
  description = "The VIP as the catalogue writes it, address:port."
  value       = "${coalesce(var.load_balancer_ip, try(kubernetes_service_v1.vip.status[0].load_balancer[0].ingress[0].ip, ""))}:${var.public_port}"
}

output "redis_url" {
  description = "Route cache URL the relays use (empty without Redis)."
  value       = local.redis_url
}
