output "namespace" {
  description = "Namespace of the region's workloads."
  value       = local.namespace
}

output "session_api" {
  description = "In-cluster URL of the cluster's session API front (the catalogue's session_api when signaling runs in this cluster)."
  value       = "http://${kubernetes_service_v1.session_api.metadata[0].name}.${local.namespace}.svc:8080"
}

output "cluster_gossip_join" {
  description = "host:port transceivers and cluster relays join for the cluster pool."
  value       = local.cluster_gossip_join
}

output "signaling_service" {
  description = "Name of the signaling Service."
  value       = kubernetes_service_v1.signaling.metadata[0].name
}

output "transceiver_termination_grace_seconds" {
  description = "Termination grace period of the transceiver pods (drain_timeout plus margin)."
  value       = local.termination_grace_seconds
}
