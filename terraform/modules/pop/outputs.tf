output "namespace" {
  description = "Namespace of the POP."
  value       = local.namespace
}

output "reserved_address" {
  description = "The reserved public address of the VIP (load_balancer_ip), known at plan time: use it for the relay DNS record and the catalogue."
  value       = var.load_balancer_ip
}

output "vip_address" {
  description = "Public address of the relay VIP as the cloud reports it once provisioned (its IP, or a hostname on some clouds); unknown at plan time, so not for DNS records or the catalogue."
  value = try(
    kubernetes_service_v1.vip.status[0].load_balancer[0].ingress[0].ip,
    kubernetes_service_v1.vip.status[0].load_balancer[0].ingress[0].hostname,
    null,
  )
}

output "vip" {
  description = "The VIP as the catalogue writes it, address:port."
  value       = "${try(coalesce(var.load_balancer_ip, kubernetes_service_v1.vip.status[0].load_balancer[0].ingress[0].ip), "")}:${var.public_port}"
}

output "redis_url" {
  description = "Route cache URL the relays use (empty without Redis)."
  value       = local.redis_url
}

output "sip_address" {
  description = "The reserved public address of the SIP front (sip.load_balancer_ip), known at plan time: use it for the SIP DNS records carriers resolve (docs/sip.md, \"Deploy\"); null without sip."
  value       = try(var.sip.load_balancer_ip, null)
}

output "sip_service" {
  description = "Name of the SIP front's LoadBalancer Service; null without sip."
  value       = local.sip_enabled ? kubernetes_service_v1.sip[0].metadata[0].name : null
}
