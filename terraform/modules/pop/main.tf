# One global relay POP: a Deployment of relays behind a UDP LoadBalancer
# Service on one fixed port, and optionally a Redis for their route cache.
#
# externalTrafficPolicy Local keeps the client's source address (flows are
# keyed by it, and replies must reach it) and makes the cloud load balancer
# health-check each node for a ready local relay; a relay's readiness is its
# /readyz, 503 while draining, so a draining replica stops getting new
# clients but keeps its flows.
#
# Session affinity ClientIP keeps every port of one client address on one
# replica: a NAT rebinding to a new port stays on the replica that knows the
# call's audio SSRC (docs/network-changes.md), and a client's candidates
# share a flow table.

locals {
  namespace = var.create_namespace ? kubernetes_namespace_v1.pop[0].metadata[0].name : coalesce(var.namespace, "rtcedge-pop-${var.name}")

  labels = {
    "app.kubernetes.io/part-of"    = "rtcedge"
    "app.kubernetes.io/managed-by" = "terraform"
    "app.kubernetes.io/name"       = "globalrelay"
    "rtcedge.example.com/region"   = var.region
    "rtcedge.example.com/pop"      = var.name
  }
  redis_labels = merge(local.labels, { "app.kubernetes.io/name" = "redis" })

  redis_url = var.redis_enabled ? "redis://rtcedge-redis.${local.namespace}.svc:6379/0" : ""

  config = {
    log_level     = var.log_level
    metrics_addr  = "0.0.0.0:9090"
    drain_timeout = "${var.drain_timeout_seconds}s"
    region        = var.region
    pop           = var.pop_id
    public_addr   = "0.0.0.0:${var.public_port}"
    # Cluster relays in every region send replies here: the pod IP must be
    # routable from the clusters.
    internal_addr = "$${POD_IP}:${var.internal_port_base}"
    workers       = var.workers
    batch         = 32
    flow_idle     = "30s"
    max_flows     = 262144
    redis_url     = local.redis_url
    gossip = {
      bind      = "0.0.0.0:7947"
      advertise = "$${POD_IP}:7947"
      join      = var.global_gossip_join
      key       = "$${RTCEDGE_GLOBAL_GOSSIP_KEY}"
    }
  }
}

resource "kubernetes_namespace_v1" "pop" {
  count = var.create_namespace ? 1 : 0
  metadata {
    name   = coalesce(var.namespace, "rtcedge-pop-${var.name}")
    labels = local.labels
  }
}

resource "kubernetes_secret_v1" "rtcedge" {
  count = var.secrets == null ? 0 : 1
  metadata {
    name      = var.secret_name
    namespace = local.namespace
    labels    = local.labels
  }
  data = var.secrets
}

resource "kubernetes_config_map_v1" "globalrelay" {
  metadata {
    name      = "rtcedge-globalrelay"
    namespace = local.namespace
    labels    = local.labels
  }
  data = {
    "config.yaml" = yamlencode(local.config)
  }
}

resource "kubernetes_deployment_v1" "globalrelay" {
  metadata {
    name      = "globalrelay"
    namespace = local.namespace
    labels    = local.labels
  }
  spec {
    replicas = var.replicas
    selector {
      match_labels = local.labels
    }
    strategy {
      type = "RollingUpdate"
      rolling_update {
        max_unavailable = "0"
        max_surge       = "1"
      }
    }
    template {
      metadata {
        labels = local.labels
        annotations = {
          "rtcedge.example.com/config-sha" = sha256(kubernetes_config_map_v1.globalrelay.data["config.yaml"])
        }
      }
      spec {
        # Drain, then a margin to leave gossip.
        termination_grace_period_seconds = var.drain_timeout_seconds + 15

        # One replica per node, so losing a node loses at most one replica.
        affinity {
          pod_anti_affinity {
            preferred_during_scheduling_ignored_during_execution {
              weight = 100
              pod_affinity_term {
                topology_key = "kubernetes.io/hostname"
                label_selector {
                  match_labels = local.labels
                }
              }
            }
          }
        }

        container {
          name  = "globalrelay"
          image = var.image
          args  = ["globalrelay", "-config", "/etc/rtcedge/config.yaml"]

          # The image's user (65532); nothing is written to the image.
          security_context {
            run_as_non_root            = true
            run_as_user                = 65532
            run_as_group               = 65532
            read_only_root_filesystem  = true
            allow_privilege_escalation = false
            capabilities {
              drop = ["ALL"]
            }
            seccomp_profile {
              type = "RuntimeDefault"
            }
          }

          env {
            name = "POD_IP"
            value_from {
              field_ref {
                field_path = "status.podIP"
              }
            }
          }

          # Without a CPU limit the runtime would size itself (and the
          # relay its workers, one per CPU) to the node's cores, not to the
          # cores this pod is given.
          env {
            name = "GOMAXPROCS"
            value_from {
              resource_field_ref {
                resource = "requests.cpu"
                divisor  = "1"
              }
            }
          }

          dynamic "env" {
            for_each = ["RTCEDGE_TOKEN_KEYS", "RTCEDGE_GLOBAL_GOSSIP_KEY", "RTCEDGE_HOP_KEYS"]
            content {
              name = env.value
              value_from {
                secret_key_ref {
                  name = var.secret_name
                  key  = env.value
                }
              }
            }
          }

          port {
            name           = "public"
            container_port = var.public_port
            protocol       = "UDP"
          }
          port {
            name           = "internal"
            container_port = var.internal_port_base
            protocol       = "UDP"
          }
          port {
            name           = "gossip-tcp"
            container_port = 7947
            protocol       = "TCP"
          }
          port {
            name           = "gossip-udp"
            container_port = 7947
            protocol       = "UDP"
          }
          port {
            name           = "metrics"
            container_port = 9090
            protocol       = "TCP"
          }

          readiness_probe {
            http_get {
              path = "/readyz"
              port = "metrics"
            }
            period_seconds    = 2
            failure_threshold = 1
          }
          liveness_probe {
            http_get {
              path = "/livez"
              port = "metrics"
            }
            period_seconds = 10
          }

          resources {
            requests = var.resources.requests
            limits   = var.resources.limits
          }

          volume_mount {
            name       = "config"
            mount_path = "/etc/rtcedge"
            read_only  = true
          }
        }

        volume {
          name = "config"
          config_map {
            name = kubernetes_config_map_v1.globalrelay.metadata[0].name
          }
        }
      }
    }
  }
}

resource "kubernetes_service_v1" "vip" {
  metadata {
    name        = "rtcedge-relay-vip"
    namespace   = local.namespace
    labels      = local.labels
    annotations = var.service_annotations
  }
  spec {
    type                    = "LoadBalancer"
    load_balancer_ip        = var.load_balancer_ip
    external_traffic_policy = "Local"
    session_affinity        = "ClientIP"
    selector                = local.labels
    port {
      name        = "media"
      port        = var.public_port
      target_port = "public"
      protocol    = "UDP"
    }
  }
  # The address appears once the cloud has provisioned the load balancer.
  wait_for_load_balancer = true
}

resource "kubernetes_deployment_v1" "redis" {
  count = var.redis_enabled ? 1 : 0
  metadata {
    name      = "rtcedge-redis"
    namespace = local.namespace
    labels    = local.redis_labels
  }
  spec {
    replicas = 1
    selector {
      match_labels = local.redis_labels
    }
    template {
      metadata {
        labels = local.redis_labels
      }
      spec {
        container {
          name  = "redis"
          image = var.redis_image
          # A cache only: nothing is persisted, entries expire on their own.
          args = ["--save", "", "--appendonly", "no", "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"]
          port {
            name           = "redis"
            container_port = 6379
            protocol       = "TCP"
          }
          readiness_probe {
            tcp_socket {
              port = "redis"
            }
            period_seconds = 5
          }
          resources {
            requests = { cpu = "250m", memory = "300Mi" }
            limits   = { memory = "400Mi" }
          }
        }
      }
    }
  }
}

resource "kubernetes_service_v1" "redis" {
  count = var.redis_enabled ? 1 : 0
  metadata {
    name      = "rtcedge-redis"
    namespace = local.namespace
    labels    = local.redis_labels
  }
  spec {
    type     = "ClusterIP"
    selector = local.redis_labels
    port {
      name        = "redis"
      port        = 6379
      target_port = "redis"
      protocol    = "TCP"
    }
  }
}

# A voluntary disruption (a node upgrade, the autoscaler) takes one replica
# at a time: the others keep the POP's VIP answering while the evicted one
# drains.
resource "kubernetes_pod_disruption_budget_v1" "globalrelay" {
  metadata {
    name      = "globalrelay"
    namespace = local.namespace
    labels    = local.labels
  }
  spec {
    max_unavailable = "1"
    selector {
      match_labels = local.labels
    }
  }
}
