# NetworkPolicies of a region: each port admits only the tiers that talk to
# it (docs/deploy.md, "Network policies"). Policies add up, so each one below
# covers one concern. Egress is not restricted. Peers in the deployment's
# other clusters can only be matched by address (remote_pod_cidrs).
#
#   transceiver   UDP 7000 data, TCP 8081 session API   <- cluster relays
#   clusterrelay  UDP 7100 data                          <- transceivers, global relays, remote
#                 TCP 8080 session API front             <- signaling, sipfront, remote
#   signaling     TCP 8080 HTTP                          <- signaling_http_cidrs, ingress
#   both of the cluster pool  TCP+UDP 7946               <- the cluster pool
#   clusterrelay, signaling   TCP+UDP 7947 global gossip <- global pool tiers, remote
#   every role    TCP 9090 metrics and probes            <- monitoring namespace, nodes

locals {
  np = var.network_policy
  # A rule without a source admits everybody, so these rules exist only
  # with one.
  np_metrics      = local.np.monitoring_namespace != null || length(local.np.node_cidrs) > 0
  np_http_limited = local.np.ingress_namespace != null || length(local.np.signaling_http_cidrs) > 0
  # Members of the global gossip pool.
  np_global_pool = ["clusterrelay", "globalrelay", "signaling"]
}

resource "kubernetes_network_policy_v1" "transceiver" {
  count = local.np.enabled ? 1 : 0
  metadata {
    name      = "rtcedge-transceiver"
    namespace = local.namespace
    labels    = local.transceiver_labels
  }
  spec {
    pod_selector {
      match_labels = local.transceiver_labels
    }
    policy_types = ["Ingress"]
    ingress {
      from {
        pod_selector {
          match_labels = local.clusterrelay_labels
        }
      }
      ports {
        port     = "7000"
        protocol = "UDP"
      }
      ports {
        port     = "8081"
        protocol = "TCP"
      }
    }
  }
}

resource "kubernetes_network_policy_v1" "clusterrelay" {
  count = local.np.enabled ? 1 : 0
  metadata {
    name      = "rtcedge-clusterrelay"
    namespace = local.namespace
    labels    = local.clusterrelay_labels
  }
  spec {
    pod_selector {
      match_labels = local.clusterrelay_labels
    }
    policy_types = ["Ingress"]
    # Media: pods send up, global relays (any namespace, or remote) down.
    ingress {
      from {
        pod_selector {
          match_labels = local.transceiver_labels
        }
      }
      from {
        namespace_selector {}
        pod_selector {
          match_labels = { "app.kubernetes.io/part-of" = "rtcedge", "app.kubernetes.io/name" = "globalrelay" }
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
        port     = "7100"
        protocol = "UDP"
      }
    }
    # The session API front: signaling and the SIP fronts (modules/pop) of
    # this and every other region.
    ingress {
      from {
        namespace_selector {}
        pod_selector {
          match_labels = { "app.kubernetes.io/part-of" = "rtcedge" }
          match_expressions {
            key      = "app.kubernetes.io/name"
            operator = "In"
            values   = ["signaling", "sipfront"]
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
        port     = "8080"
        protocol = "TCP"
      }
    }
  }
}

resource "kubernetes_network_policy_v1" "signaling" {
  count = local.np.enabled ? 1 : 0
  metadata {
    name      = "rtcedge-signaling"
    namespace = local.namespace
    labels    = local.signaling_labels
  }
  spec {
    pod_selector {
      match_labels = local.signaling_labels
    }
    policy_types = ["Ingress"]
    # HTTP from Cloudflare or the ingress in front; open when neither is
    # given (then firewall the origin elsewhere, see docs/deploy.md).
    ingress {
      dynamic "from" {
        for_each = local.np.signaling_http_cidrs
        content {
          ip_block {
            cidr = from.value
          }
        }
      }
      dynamic "from" {
        for_each = local.np.ingress_namespace == null ? [] : [local.np.ingress_namespace]
        content {
          namespace_selector {
            match_labels = { "kubernetes.io/metadata.name" = from.value }
          }
        }
      }
      ports {
        port     = "8080"
        protocol = "TCP"
      }
    }
  }

  lifecycle {
    precondition {
      condition     = local.np_http_limited || var.signaling_service_type != "LoadBalancer"
      error_message = "A LoadBalancer signaling Service with network policies needs network_policy.signaling_http_cidrs (Cloudflare's ranges) or ingress_namespace; otherwise anyone can reach the origin around Cloudflare."
    }
  }
}

resource "kubernetes_network_policy_v1" "cluster_gossip" {
  count = local.np.enabled ? 1 : 0
  metadata {
    name      = "rtcedge-cluster-gossip"
    namespace = local.namespace
    labels    = local.common_labels
  }
  spec {
    pod_selector {
      match_labels = local.cluster_gossip_labels
    }
    policy_types = ["Ingress"]
    ingress {
      from {
        pod_selector {
          match_labels = local.cluster_gossip_labels
        }
      }
      ports {
        port     = "7946"
        protocol = "TCP"
      }
      ports {
        port     = "7946"
        protocol = "UDP"
      }
    }
  }
}

resource "kubernetes_network_policy_v1" "global_gossip" {
  count = local.np.enabled ? 1 : 0
  metadata {
    name      = "rtcedge-global-gossip"
    namespace = local.namespace
    labels    = local.common_labels
  }
  spec {
    pod_selector {
      match_labels = local.common_labels
      match_expressions {
        key      = "app.kubernetes.io/name"
        operator = "In"
        values   = ["clusterrelay", "signaling"]
      }
    }
    policy_types = ["Ingress"]
    ingress {
      from {
        namespace_selector {}
        pod_selector {
          match_labels = { "app.kubernetes.io/part-of" = "rtcedge" }
          match_expressions {
            key      = "app.kubernetes.io/name"
            operator = "In"
            values   = local.np_global_pool
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
  }
}

resource "kubernetes_network_policy_v1" "metrics" {
  count = local.np.enabled && local.np_metrics ? 1 : 0
  metadata {
    name      = "rtcedge-metrics"
    namespace = local.namespace
    labels    = local.common_labels
  }
  spec {
    pod_selector {
      match_labels = local.common_labels
    }
    policy_types = ["Ingress"]
    ingress {
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
