# NetworkPolicies of a POP (docs/deploy.md, "Network policies"): each port
# admits only the tiers that talk to it. Egress is not restricted. Peers in
# the deployment's other clusters can only be matched by address
# (remote_pod_cidrs).
#
#   globalrelay  UDP public_port (media)             <- anywhere: the clients
#                UDP internal ports (replies)        <- cluster relays, remote
#                TCP+UDP 7947 global gossip          <- global pool tiers, remote
#                TCP 9090 metrics and probes         <- monitoring namespace, nodes
#   redis        TCP 6379                            <- the relays, transceivers (phone calls' route entries)
#   sipfront     UDP+TCP 5060, TCP 5061 (SIP)        <- the trunks' source_cidrs
#                TCP 9090 metrics and probes         <- monitoring namespace, nodes
#                egress: DNS, the session APIs (cluster relays' 8080 in this
#                cluster, session_api_cidrs elsewhere), the trunks (BYE)

locals {
  np         = var.network_policy
  np_metrics = local.np.monitoring_namespace != null || length(local.np.node_cidrs) > 0
  # Worker i binds internal_port_base + i; 0 workers means one per CPU.
  internal_port_last = var.internal_port_base + (var.workers > 0 ? var.workers - 1 : 255)
}

resource "kubernetes_network_policy_v1" "globalrelay" {
  count = local.np.enabled ? 1 : 0
  metadata {
    name      = "rtcedge-globalrelay"
    namespace = local.namespace
    labels    = local.labels
  }
  spec {
    pod_selector {
      match_labels = local.labels
    }
    policy_types = ["Ingress"]
    # Clients worldwide (the VIP keeps their addresses).
    ingress {
      ports {
        port     = tostring(var.public_port)
        protocol = "UDP"
      }
    }
    # Replies from the cluster relays of every region.
    ingress {
      from {
        namespace_selector {}
        pod_selector {
          match_labels = { "app.kubernetes.io/part-of" = "rtcedge", "app.kubernetes.io/name" = "clusterrelay" }
        }
      }
      dynamic "from" {
        for_each = local.np.remote_pod_cidrs
        content {
          ip_block {
            cidr = from.value
          }
        }
      }
      ports {
        port     = tostring(var.internal_port_base)
        end_port = local.internal_port_last
        protocol = "UDP"
      }
    }
    ingress {
      from {
        namespace_selector {}
        pod_selector {
          match_labels = { "app.kubernetes.io/part-of" = "rtcedge" }
          match_expressions {
            key      = "app.kubernetes.io/name"
            operator = "In"
            values   = ["clusterrelay", "globalrelay", "signaling"]
          }
        }
      }
      dynamic "from" {
        for_each = local.np.remote_pod_cidrs
        content {
          ip_block {
            cidr = from.value
          }
        }
      }
      ports {
        port     = "7947"
        protocol = "TCP"
      }
      ports {
        port     = "7947"
        protocol = "UDP"
      }
    }
    dynamic "ingress" {
      for_each = local.np_metrics ? [1] : []
      content {
        dynamic "from" {
          for_each = local.np.monitoring_namespace == null ? [] : [local.np.monitoring_namespace]
          content {
            namespace_selector {
              match_labels = { "kubernetes.io/metadata.name" = from.value }
            }
          }
        }
        dynamic "from" {
          for_each = local.np.node_cidrs
          content {
            ip_block {
              cidr = from.value
            }
          }
        }
        ports {
          port     = "9090"
          protocol = "TCP"
        }
      }
    }
  }
}

resource "kubernetes_network_policy_v1" "redis" {
  count = local.np.enabled && var.redis_enabled ? 1 : 0
  metadata {
    name      = "rtcedge-redis"
    namespace = local.namespace
    labels    = local.redis_labels
  }
  spec {
    pod_selector {
      match_labels = local.redis_labels
    }
    policy_types = ["Ingress"]
    ingress {
      from {
        pod_selector {
          match_labels = local.labels
        }
      }
      # Transceivers write phone calls' route entries here (the region
      # module's route_cache_url), from their own namespace.
      from {
        namespace_selector {}
        pod_selector {
          match_labels = { "app.kubernetes.io/part-of" = "rtcedge", "app.kubernetes.io/name" = "transceiver" }
        }
      }
      ports {
        port     = "6379"
        protocol = "TCP"
      }
    }
  }
}

# The SIP front, least privilege both ways: it hears SIP from the trunks
# only, and speaks to DNS, the clusters' session APIs and the trunks (its
# own requests: BYE, and answers over new connections) only.
resource "kubernetes_network_policy_v1" "sipfront" {
  count = local.np.enabled && local.sip_enabled ? 1 : 0
  metadata {
    name      = "rtcedge-sipfront"
    namespace = local.namespace
    labels    = local.sip_labels
  }
  spec {
    pod_selector {
      match_labels = local.sip_labels
    }
    policy_types = ["Ingress", "Egress"]
    ingress {
      dynamic "from" {
        for_each = local.sip_source_cidrs
        content {
          ip_block {
            cidr = from.value
          }
        }
      }
      ports {
        port     = "5060"
        protocol = "UDP"
      }
      ports {
        port     = "5060"
        protocol = "TCP"
      }
      ports {
        port     = "5061"
        protocol = "TCP"
      }
    }
    dynamic "ingress" {
      for_each = local.np_metrics ? [1] : []
      content {
        dynamic "from" {
          for_each = local.np.monitoring_namespace == null ? [] : [local.np.monitoring_namespace]
          content {
            namespace_selector {
              match_labels = { "kubernetes.io/metadata.name" = from.value }
            }
          }
        }
        dynamic "from" {
          for_each = local.np.node_cidrs
          content {
            ip_block {
              cidr = from.value
            }
          }
        }
        ports {
          port     = "9090"
          protocol = "TCP"
        }
      }
    }
    # Names: the catalogue's session_api hosts, the trunks' Contacts.
    egress {
      to {
        namespace_selector {}
        pod_selector {
          match_labels = { "k8s-app" = "kube-dns" }
        }
      }
      ports {
        port     = "53"
        protocol = "UDP"
      }
      ports {
        port     = "53"
        protocol = "TCP"
      }
    }
    # The session APIs of clusters in this Kubernetes cluster.
    egress {
      to {
        namespace_selector {}
        pod_selector {
          match_labels = { "app.kubernetes.io/part-of" = "rtcedge", "app.kubernetes.io/name" = "clusterrelay" }
        }
      }
      ports {
        port     = "8080"
        protocol = "TCP"
      }
    }
    # The session APIs elsewhere (other regions' internal load balancers).
    dynamic "egress" {
      for_each = length(try(var.sip.session_api_cidrs, [])) > 0 ? [1] : []
      content {
        dynamic "to" {
          for_each = var.sip.session_api_cidrs
          content {
            ip_block {
              cidr = to.value
            }
          }
        }
        dynamic "ports" {
          for_each = var.sip.session_api_ports
          content {
            port     = tostring(ports.value)
            protocol = "TCP"
          }
        }
      }
    }
    # The trunks: a carrier's Contact port is its own choice.
    egress {
      dynamic "to" {
        for_each = local.sip_source_cidrs
        content {
          ip_block {
            cidr = to.value
          }
        }
      }
    }
  }
}
