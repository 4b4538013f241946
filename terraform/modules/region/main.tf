# One region's Kubernetes workloads (docs/operations.md, "Kubernetes shape"):
# the transceiver StatefulSet, the cluster relays with the session API front,
# the cluster gossip Service, and the signaling fronts, each role configured by
# a ConfigMap in the format of deploy/examples.
#
# Role configs advertise "${POD_IP}:port": rtcedge expands ${VAR} in its
# config files, and each container gets POD_IP from the downward API.

locals {
  # SHA-256 of each value of the Secret this module manages, by key (null
  # when it is managed out of band): each role's pod template carries a
  # checksum of the keys it reads, so changing a key rolls exactly the pods
  # that read it (modules/workload, secret_hashes). Read from the resource,
  # so a roll starts only once the Secret holds the new values.
  secret_hashes = nonsensitive(var.secrets == null) ? null : nonsensitive({ for k, v in kubernetes_secret_v1.rtcedge[0].data : k => sha256(v) })

  namespace = var.create_namespace ? kubernetes_namespace_v1.region[0].metadata[0].name : coalesce(var.namespace, "rtcedge-${var.region}")

  common_labels = {
    "app.kubernetes.io/part-of"    = "rtcedge"
    "app.kubernetes.io/managed-by" = "terraform"
    "rtcedge.example.com/region"   = var.region
    "rtcedge.example.com/cluster"  = tostring(var.cluster_id)
  }
  transceiver_labels  = merge(local.common_labels, { "app.kubernetes.io/name" = "transceiver" })
  clusterrelay_labels = merge(local.common_labels, { "app.kubernetes.io/name" = "clusterrelay" })
  signaling_labels    = merge(local.common_labels, { "app.kubernetes.io/name" = "signaling" })
  # Both transceivers and cluster relays join the cluster pool.
  cluster_gossip_labels = merge(local.common_labels, { "rtcedge.example.com/cluster-gossip" = "true" })

  cluster_gossip_service = "rtcedge-cluster-gossip"
  cluster_gossip_join    = "${local.cluster_gossip_service}.${local.namespace}.svc:7946"
  session_api_service    = "rtcedge-session-api"

  # The transceiver needs the whole drain plus time to end the remaining
  # calls and leave gossip before the kubelet kills it.
  termination_grace_seconds = var.drain_timeout_seconds + 30

  transceiver_config = {
    log_level       = var.log_level
    metrics_addr    = "0.0.0.0:9090"
    drain_timeout   = "${var.drain_timeout_seconds}s"
    region          = var.region
    cluster         = var.cluster_id
    pod             = 0 # from the StatefulSet ordinal: transceiver-3 -> 4
    data_addr       = "0.0.0.0:7000"
    data_advertise  = "$${POD_IP}:7000"
    api_addr        = "0.0.0.0:8081"
    api_advertise   = "$${POD_IP}:8081"
    max_sessions    = var.max_sessions
    connect_timeout = "30s"
    idle_timeout    = "60s"
    dtls_role       = "client"
    # Phone calls' route entries (docs/wire.md section 6).
    redis_url = var.route_cache_url
    gossip = {
      bind      = "0.0.0.0:7946"
      advertise = "$${POD_IP}:7946"
      join      = [local.cluster_gossip_join]
      key       = "$${RTCEDGE_CLUSTER_GOSSIP_KEY}" # the cluster pool's own: a pod never holds the global pool's
    }
  }

  clusterrelay_config = {
    log_level      = var.log_level
    metrics_addr   = "0.0.0.0:9090"
    region         = var.region
    cluster        = var.cluster_id
    data_addr      = "0.0.0.0:7100"
    data_advertise = "$${POD_IP}:7100"
    api_addr       = "0.0.0.0:8080"
    api_advertise  = "$${POD_IP}:8080"
    batch          = 32
    cluster_gossip = {
      bind      = "0.0.0.0:7946"
      advertise = "$${POD_IP}:7946"
      join      = [local.cluster_gossip_join]
      key       = "$${RTCEDGE_CLUSTER_GOSSIP_KEY}"
    }
    global_gossip = {
      bind      = "0.0.0.0:7947"
      advertise = "$${POD_IP}:7947"
      join      = var.global_gossip_join
      key       = "$${RTCEDGE_GLOBAL_GOSSIP_KEY}"
    }
    # Public keys (signaling's among them), and the cluster's own secret
    # as a file the kubelet updates in place: a rotation needs no restart.
    authority = { keys = var.global_pool_public_keys, file = "/etc/rtcedge-authority/RTCEDGE_AUTHORITY_KEYS" }
  }

  signaling_config = {
    log_level         = var.log_level
    metrics_addr      = "0.0.0.0:9090"
    listen_addr       = "0.0.0.0:8080"
    catalogue         = "/etc/rtcedge-catalogue/catalogue.yaml"
    geoip_db          = var.geoip_claim_name == null ? "" : "/var/lib/geoip/GeoLite2-City.mmdb"
    trusted_proxies   = var.trusted_proxies
    cors_origins      = var.cors_origins
    demo_page         = false
    client_secret_ttl = "10m"
    rate_per_second   = 5
    rate_burst        = 20
    # Signaling's own secret proves its metadata in the global pool; with
    # the public keys it believes a cluster relay or a POP only on that
    # cluster's or POP's key (docs/operations.md, "The global pool").
    authority = { keys = var.global_pool_public_keys, file = "/etc/rtcedge-authority/RTCEDGE_SIGNALING_AUTHORITY_KEYS" }
    gossip = {
      bind      = "0.0.0.0:7947"
      advertise = "$${POD_IP}:7947"
      join      = var.global_gossip_join
      key       = "$${RTCEDGE_GLOBAL_GOSSIP_KEY}"
    }
  }
}

resource "kubernetes_namespace_v1" "region" {
  count = var.create_namespace ? 1 : 0
  metadata {
    name   = coalesce(var.namespace, "rtcedge-${var.region}")
    labels = local.common_labels
  }
}

resource "kubernetes_secret_v1" "rtcedge" {
  count = var.secrets == null ? 0 : 1
  metadata {
    name      = var.secret_name
    namespace = local.namespace
    labels    = local.common_labels
  }
  data = var.secrets
}

resource "kubernetes_config_map_v1" "catalogue" {
  metadata {
    name      = "rtcedge-catalogue"
    namespace = local.namespace
    labels    = local.common_labels
  }
  data = {
    "catalogue.yaml" = var.catalogue_yaml
  }
}

# Headless: DNS returns every pod, ready or not, so memberlist can join
# before anyone is ready.
resource "kubernetes_service_v1" "cluster_gossip" {
  metadata {
    name      = local.cluster_gossip_service
    namespace = local.namespace
    labels    = local.common_labels
  }
  spec {
    cluster_ip                  = "None"
    publish_not_ready_addresses = true
    selector                    = local.cluster_gossip_labels
    port {
      name        = "gossip-tcp"
      port        = 7946
      target_port = 7946
      protocol    = "TCP"
    }
    port {
      name        = "gossip-udp"
      port        = 7946
      target_port = 7946
      protocol    = "UDP"
    }
  }
}

# Secret keys: each role gets only its own. Each gossip pool has its own
# key: transceivers, the most exposed code, hold only the cluster pool's.
module "transceiver" {
  source                    = "../workload"
  name                      = "transceiver" # pod names transceiver-N give pod IDs N+1
  namespace                 = local.namespace
  labels                    = local.transceiver_labels
  pod_labels                = local.cluster_gossip_labels
  image                     = var.image
  config                    = local.transceiver_config
  replicas                  = var.transceiver_replicas
  service_name              = kubernetes_service_v1.cluster_gossip.metadata[0].name
  termination_grace_seconds = local.termination_grace_seconds
  secret_name               = var.secret_name
  secret_hashes             = local.secret_hashes
  secret_keys               = ["RTCEDGE_CLUSTER_GOSSIP_KEY"]
  # Token, hop, gossip-proof and session API keys: the pod's own only.
  # Its own Secret key, not the relays' (which they reload on change): a
  # rotation makes a new secret current for pods (by rolling them) before
  # the relays seal toward pods with it (docs/operations.md, "Rotation").
  key_issuer                  = { cluster = var.cluster_id, secret_key = "RTCEDGE_ISSUER_AUTHORITY_KEYS" }
  readiness_failure_threshold = 2
  resources                   = var.transceiver_resources
  ports = [
    { name = "data", port = 7000, protocol = "UDP" },
    { name = "api", port = 8081, protocol = "TCP" },
    { name = "gossip-tcp", port = 7946, protocol = "TCP" },
    { name = "gossip-udp", port = 7946, protocol = "UDP" },
    { name = "metrics", port = 9090, protocol = "TCP" },
  ]
}

# Cluster relays keep every replica until its successor is ready: global
# relays move flows off a draining replica at once.
module "clusterrelay" {
  source            = "../workload"
  name              = "clusterrelay"
  namespace         = local.namespace
  labels            = local.clusterrelay_labels
  pod_labels        = local.cluster_gossip_labels
  image             = var.image
  config            = local.clusterrelay_config
  replicas          = var.clusterrelay_replicas
  start_before_stop = true
  secret_name       = var.secret_name
  secret_hashes     = local.secret_hashes
  secret_keys       = ["RTCEDGE_CLUSTER_GOSSIP_KEY", "RTCEDGE_GLOBAL_GOSSIP_KEY"]
  volumes           = [{ name = "authority", mount_path = "/etc/rtcedge-authority", secret_key = "RTCEDGE_AUTHORITY_KEYS" }]
  ports = [
    { name = "data", port = 7100, protocol = "UDP" },
    { name = "api", port = 8080, protocol = "TCP" },
    { name = "cgossip-tcp", port = 7946, protocol = "TCP" },
    { name = "cgossip-udp", port = 7946, protocol = "UDP" },
    { name = "ggossip-tcp", port = 7947, protocol = "TCP" },
    { name = "ggossip-udp", port = 7947, protocol = "UDP" },
    { name = "metrics", port = 9090, protocol = "TCP" },
  ]
}

# The cluster's session API (the catalogue's session_api): any cluster relay
# replica serves it.
resource "kubernetes_service_v1" "session_api" {
  metadata {
    name      = local.session_api_service
    namespace = local.namespace
    labels    = local.clusterrelay_labels
  }
  spec {
    type     = "ClusterIP"
    selector = local.clusterrelay_labels
    port {
      name        = "api"
      port        = 8080
      target_port = "api"
      protocol    = "TCP"
    }
  }
}

module "signaling" {
  source        = "../workload"
  name          = "signaling"
  namespace     = local.namespace
  labels        = local.signaling_labels
  annotations   = { "rtcedge.example.com/catalogue-sha" = sha256(var.catalogue_yaml) }
  image         = var.image
  config        = local.signaling_config
  replicas      = var.signaling_replicas
  secret_name   = var.secret_name
  secret_hashes = local.secret_hashes
  secret_keys   = ["RTCEDGE_API_KEYS", "RTCEDGE_CLIENT_SECRET_KEY", "RTCEDGE_GLOBAL_GOSSIP_KEY"]
  ports = [
    { name = "http", port = 8080, protocol = "TCP" },
    { name = "ggossip-tcp", port = 7947, protocol = "TCP" },
    { name = "ggossip-udp", port = 7947, protocol = "UDP" },
    { name = "metrics", port = 9090, protocol = "TCP" },
  ]
  volumes = concat(
    [{ name = "catalogue", mount_path = "/etc/rtcedge-catalogue", config_map = kubernetes_config_map_v1.catalogue.metadata[0].name },
    { name = "authority", mount_path = "/etc/rtcedge-authority", secret_key = "RTCEDGE_SIGNALING_AUTHORITY_KEYS" }],
    var.geoip_claim_name == null ? [] : [{ name = "geoip", mount_path = "/var/lib/geoip", claim = var.geoip_claim_name }],
  )
}

resource "kubernetes_service_v1" "signaling" {
  metadata {
    name        = "rtcedge-signaling"
    namespace   = local.namespace
    labels      = local.signaling_labels
    annotations = var.signaling_service_annotations
  }
  spec {
    type     = var.signaling_service_type
    selector = local.signaling_labels
    port {
      name        = "http"
      port        = 80
      target_port = "http"
      protocol    = "TCP"
    }
  }
}

# Where the roles' resources stood before the workload module.
moved {
  from = kubernetes_config_map_v1.transceiver
  to   = module.transceiver.kubernetes_config_map_v1.this
}
moved {
  from = kubernetes_stateful_set_v1.transceiver
  to   = module.transceiver.kubernetes_stateful_set_v1.this[0]
}
moved {
  from = kubernetes_pod_disruption_budget_v1.transceiver
  to   = module.transceiver.kubernetes_pod_disruption_budget_v1.this
}
moved {
  from = kubernetes_config_map_v1.clusterrelay
  to   = module.clusterrelay.kubernetes_config_map_v1.this
}
moved {
  from = kubernetes_deployment_v1.clusterrelay
  to   = module.clusterrelay.kubernetes_deployment_v1.this[0]
}
moved {
  from = kubernetes_pod_disruption_budget_v1.clusterrelay
  to   = module.clusterrelay.kubernetes_pod_disruption_budget_v1.this
}
moved {
  from = kubernetes_config_map_v1.signaling
  to   = module.signaling.kubernetes_config_map_v1.this
}
moved {
  from = kubernetes_deployment_v1.signaling
  to   = module.signaling.kubernetes_deployment_v1.this[0]
}
moved {
  from = kubernetes_pod_disruption_budget_v1.signaling
  to   = module.signaling.kubernetes_pod_disruption_budget_v1.this
}
