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
  # SHA-256 of each value of the Secret this module manages, by key (null
  # when it is managed out of band): each role's pod template carries a
  # checksum of the keys it reads, so changing a key rolls exactly the pods
  # that read it (modules/workload, secret_hashes). Read from the resource,
  # so a roll starts only once the Secret holds the new values.
  secret_hashes = nonsensitive(var.secrets == null) ? null : nonsensitive({ for k, v in kubernetes_secret_v1.rtcedge[0].data : k => sha256(v) })

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
    # The served clusters' secrets and this POP's, as a file the kubelet
    # updates in place: a rotation needs no restart (docs/operations.md).
    authority = { file = "/etc/rtcedge-authority/RTCEDGE_AUTHORITY_KEYS" }
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

# The global relays: one replica per node preferred, so losing a node loses
# at most one; a drain, then a margin to leave gossip.
module "globalrelay" {
  source                      = "../workload"
  name                        = "globalrelay"
  namespace                   = local.namespace
  labels                      = local.labels
  image                       = var.image
  config                      = local.config
  replicas                    = var.replicas
  start_before_stop           = true
  spread_over_nodes           = true
  termination_grace_seconds   = var.drain_timeout_seconds + 15
  secret_name                 = var.secret_name
  secret_hashes               = local.secret_hashes
  secret_keys                 = ["RTCEDGE_GLOBAL_GOSSIP_KEY"]
  volumes                     = [{ name = "authority", mount_path = "/etc/rtcedge-authority", secret_key = "RTCEDGE_AUTHORITY_KEYS" }]
  readiness_period_seconds    = 2
  readiness_failure_threshold = 1
  resources                   = var.resources
  ports = [
    { name = "public", port = var.public_port, protocol = "UDP" },
    { name = "internal", port = var.internal_port_base, protocol = "UDP" },
    { name = "gossip-tcp", port = 7947, protocol = "TCP" },
    { name = "gossip-udp", port = 7947, protocol = "UDP" },
    { name = "metrics", port = 9090, protocol = "TCP" },
  ]
}

# Where the global relays' resources stood before the workload module.
moved {
  from = kubernetes_config_map_v1.globalrelay
  to   = module.globalrelay.kubernetes_config_map_v1.this
}
moved {
  from = kubernetes_deployment_v1.globalrelay
  to   = module.globalrelay.kubernetes_deployment_v1.this[0]
}
moved {
  from = kubernetes_pod_disruption_budget_v1.globalrelay
  to   = module.globalrelay.kubernetes_pod_disruption_budget_v1.this
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
