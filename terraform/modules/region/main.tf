# One region's Kubernetes workloads (docs/operations.md, "Kubernetes shape"):
# the transceiver StatefulSet, the cluster relays with the session API front,
# the cluster gossip Service, and the signaling fronts, each role configured by
# a ConfigMap in the format of deploy/examples.
#
# Role configs advertise "${POD_IP}:port": rtcedge expands ${VAR} in its
# config files, and each container gets POD_IP from the downward API.

locals {
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
    gossip = {
      bind      = "0.0.0.0:7947"
      advertise = "$${POD_IP}:7947"
      join      = var.global_gossip_join
      key       = "$${RTCEDGE_GLOBAL_GOSSIP_KEY}"
    }
  }

  # Secret keys each role reads (docs/operations.md); a role gets only its own.
  # Each gossip pool has its own key: transceivers, the most exposed code,
  # hold only the cluster pool's.
  transceiver_secret_keys  = ["RTCEDGE_TOKEN_KEYS", "RTCEDGE_TOKEN_CURRENT", "RTCEDGE_CLUSTER_GOSSIP_KEY", "RTCEDGE_HOP_KEYS"]
  clusterrelay_secret_keys = ["RTCEDGE_CLUSTER_GOSSIP_KEY", "RTCEDGE_GLOBAL_GOSSIP_KEY", "RTCEDGE_HOP_KEYS"]
  signaling_secret_keys    = ["RTCEDGE_API_KEYS", "RTCEDGE_CLIENT_SECRET_KEY", "RTCEDGE_GLOBAL_GOSSIP_KEY"]
  # Absent keys are tolerated only where the role has a default.
  optional_secret_keys = ["RTCEDGE_TOKEN_CURRENT"]
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

resource "kubernetes_config_map_v1" "transceiver" {
  metadata {
    name      = "rtcedge-transceiver"
    namespace = local.namespace
    labels    = local.transceiver_labels
  }
  data = {
    "config.yaml" = yamlencode(local.transceiver_config)
  }
}

resource "kubernetes_config_map_v1" "clusterrelay" {
  metadata {
    name      = "rtcedge-clusterrelay"
    namespace = local.namespace
    labels    = local.clusterrelay_labels
  }
  data = {
    "config.yaml" = yamlencode(local.clusterrelay_config)
  }
}

resource "kubernetes_config_map_v1" "signaling" {
  metadata {
    name      = "rtcedge-signaling"
    namespace = local.namespace
    labels    = local.signaling_labels
  }
  data = {
    "config.yaml" = yamlencode(local.signaling_config)
  }
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

resource "kubernetes_stateful_set_v1" "transceiver" {
  metadata {
    name      = "transceiver" # pod names transceiver-N give pod IDs N+1
    namespace = local.namespace
    labels    = local.transceiver_labels
  }
  spec {
    service_name = kubernetes_service_v1.cluster_gossip.metadata[0].name
    replicas     = var.transceiver_replicas
    # Pods are independent; start and replace them all at once.
    pod_management_policy = "Parallel"
    selector {
      match_labels = local.transceiver_labels
    }
    template {
      metadata {
        labels = merge(local.transceiver_labels, local.cluster_gossip_labels)
        annotations = {
          "rtcedge.example.com/config-sha" = sha256(kubernetes_config_map_v1.transceiver.data["config.yaml"])
        }
      }
      spec {
        termination_grace_period_seconds = local.termination_grace_seconds

        container {
          name  = "transceiver"
          image = var.image
          args  = ["transceiver", "-config", "/etc/rtcedge/config.yaml"]

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
            for_each = local.transceiver_secret_keys
            content {
              name = env.value
              value_from {
                secret_key_ref {
                  name     = var.secret_name
                  key      = env.value
                  optional = contains(local.optional_secret_keys, env.value)
                }
              }
            }
          }

          port {
            name           = "data"
            container_port = 7000
            protocol       = "UDP"
          }
          port {
            name           = "api"
            container_port = 8081
            protocol       = "TCP"
          }
          port {
            name           = "gossip-tcp"
            container_port = 7946
            protocol       = "TCP"
          }
          port {
            name           = "gossip-udp"
            container_port = 7946
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
            period_seconds    = 5
            failure_threshold = 2
          }
          liveness_probe {
            http_get {
              path = "/livez"
              port = "metrics"
            }
            period_seconds    = 10
            failure_threshold = 3
          }

          resources {
            requests = var.transceiver_resources.requests
            limits   = var.transceiver_resources.limits
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
            name = kubernetes_config_map_v1.transceiver.metadata[0].name
          }
        }
      }
    }
  }
}

resource "kubernetes_deployment_v1" "clusterrelay" {
  metadata {
    name      = "clusterrelay"
    namespace = local.namespace
    labels    = local.clusterrelay_labels
  }
  spec {
    replicas = var.clusterrelay_replicas
    selector {
      match_labels = local.clusterrelay_labels
    }
    strategy {
      type = "RollingUpdate"
      rolling_update {
        # Keep every replica until its successor is ready: global relays
        # move flows off a draining replica at once.
        max_unavailable = "0"
        max_surge       = "1"
      }
    }
    template {
      metadata {
        labels = merge(local.clusterrelay_labels, local.cluster_gossip_labels)
        annotations = {
          "rtcedge.example.com/config-sha" = sha256(kubernetes_config_map_v1.clusterrelay.data["config.yaml"])
        }
      }
      spec {
        termination_grace_period_seconds = 30

        container {
          name  = "clusterrelay"
          image = var.image
          args  = ["clusterrelay", "-config", "/etc/rtcedge/config.yaml"]

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

          dynamic "env" {
            for_each = local.clusterrelay_secret_keys
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
            name           = "data"
            container_port = 7100
            protocol       = "UDP"
          }
          port {
            name           = "api"
            container_port = 8080
            protocol       = "TCP"
          }
          port {
            name           = "cgossip-tcp"
            container_port = 7946
            protocol       = "TCP"
          }
          port {
            name           = "cgossip-udp"
            container_port = 7946
            protocol       = "UDP"
          }
          port {
            name           = "ggossip-tcp"
            container_port = 7947
            protocol       = "TCP"
          }
          port {
            name           = "ggossip-udp"
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
            period_seconds = 5
          }
          liveness_probe {
            http_get {
              path = "/livez"
              port = "metrics"
            }
            period_seconds = 10
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
            name = kubernetes_config_map_v1.clusterrelay.metadata[0].name
          }
        }
      }
    }
  }
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

resource "kubernetes_deployment_v1" "signaling" {
  metadata {
    name      = "signaling"
    namespace = local.namespace
    labels    = local.signaling_labels
  }
  spec {
    replicas = var.signaling_replicas
    selector {
      match_labels = local.signaling_labels
    }
    template {
      metadata {
        labels = local.signaling_labels
        annotations = {
          "rtcedge.example.com/config-sha"    = sha256(kubernetes_config_map_v1.signaling.data["config.yaml"])
          "rtcedge.example.com/catalogue-sha" = sha256(var.catalogue_yaml)
        }
      }
      spec {
        termination_grace_period_seconds = 30

        container {
          name  = "signaling"
          image = var.image
          args  = ["signaling", "-config", "/etc/rtcedge/config.yaml"]

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

          dynamic "env" {
            for_each = local.signaling_secret_keys
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
            name           = "http"
            container_port = 8080
            protocol       = "TCP"
          }
          port {
            name           = "ggossip-tcp"
            container_port = 7947
            protocol       = "TCP"
          }
          port {
            name           = "ggossip-udp"
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
            period_seconds = 5
          }
          liveness_probe {
            http_get {
              path = "/livez"
              port = "metrics"
            }
            period_seconds = 10
          }

          volume_mount {
            name       = "config"
            mount_path = "/etc/rtcedge"
            read_only  = true
          }
          volume_mount {
            name       = "catalogue"
            mount_path = "/etc/rtcedge-catalogue"
            read_only  = true
          }
          dynamic "volume_mount" {
            for_each = var.geoip_claim_name == null ? [] : [var.geoip_claim_name]
            content {
              name       = "geoip"
              mount_path = "/var/lib/geoip"
              read_only  = true
            }
          }
        }

        volume {
          name = "config"
          config_map {
            name = kubernetes_config_map_v1.signaling.metadata[0].name
          }
        }
        volume {
          name = "catalogue"
          config_map {
            name = kubernetes_config_map_v1.catalogue.metadata[0].name
          }
        }
        dynamic "volume" {
          for_each = var.geoip_claim_name == null ? [] : [var.geoip_claim_name]
          content {
            name = "geoip"
            persistent_volume_claim {
              claim_name = volume.value
              read_only  = true
            }
          }
        }
      }
    }
  }
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

# A voluntary disruption (a node upgrade, the autoscaler) takes one pod of
# each role at a time: evicting both transceivers or both cluster relays at
# once would end every call of the region.
resource "kubernetes_pod_disruption_budget_v1" "transceiver" {
  metadata {
    name      = "transceiver"
    namespace = local.namespace
    labels    = local.transceiver_labels
  }
  spec {
    max_unavailable = "1"
    selector {
      match_labels = local.transceiver_labels
    }
  }
}

resource "kubernetes_pod_disruption_budget_v1" "clusterrelay" {
  metadata {
    name      = "clusterrelay"
    namespace = local.namespace
    labels    = local.clusterrelay_labels
  }
  spec {
    max_unavailable = "1"
    selector {
      match_labels = local.clusterrelay_labels
    }
  }
}

resource "kubernetes_pod_disruption_budget_v1" "signaling" {
  metadata {
    name      = "signaling"
    namespace = local.namespace
    labels    = local.signaling_labels
  }
  spec {
    max_unavailable = "1"
    selector {
      match_labels = local.signaling_labels
    }
  }
}
