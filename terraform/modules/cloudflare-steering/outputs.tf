output "monitor_id" {
  description = "ID of the signaling readiness monitor."
  value       = cloudflare_load_balancer_monitor.signaling.id
}

output "pool_ids" {
  description = "Pool ID by region."
  value       = local.pool_ids
}

output "load_balancer_id" {
  description = "ID of the signaling load balancer."
  value       = cloudflare_load_balancer.signaling.id
}

output "relay_records" {
  description = "Relay DNS record name by POP."
  value       = { for k, r in cloudflare_dns_record.relay : k => r.name }
}
