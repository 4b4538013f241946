# One rtcedge role's pods (docs/operations.md, "Kubernetes shape"): its
# ConfigMap, its Deployment or StatefulSet, and its PodDisruptionBudget. The
# region and pop modules call this once per role, so what every role's pods
# share is written here once.
#
# A Deployment and a StatefulSet cannot share a block in HCL: both carry the
# same pod template below, and TestWorkloadKindsShareOnePodTemplate keeps the
# two copies identical.

terraform {
  required_providers {
    kubernetes = { source = "hashicorp/kubernetes" } # the version is the callers'
  }
}

locals {
  # Secret keys that may be absent: the binary has a default.
  optional_secret_keys = ["RTCEDGE_TOKEN_CURRENT"]

  pod_labels = merge(var.labels, var.pod_labels)

  # Every key of secret_name the pods read, at start (environment, the key
  # issuer) or as a reloaded file: a change of any of them rolls the pods
  # through secret-sha. A reloaded file would reach running pods too, but
  # only within the kubelet's sync period; the roll makes it certain, and
  # Terraform's wait for the rollout orders the rotation's steps.
  read_secret_keys = sort(distinct(concat(
    var.secret_keys,
    [for v in var.volumes : v.secret_key if v.secret_key != null],
    var.key_issuer == null ? [] : [var.key_issuer.secret_key],
  )))
  secret_annotation = var.secret_hashes == null ? {} : {
    "rtcedge.example.com/secret-sha" = sha256(jsonencode({ for k in local.read_secret_keys : k => lookup(var.secret_hashes, k, "") }))
  }

  annotations = merge(
    { "rtcedge.example.com/config-sha" = sha256(kubernetes_config_map_v1.this.data["config.yaml"]) },
    local.secret_annotation,
    var.annotations,
  )
  volumes = concat([{ name = "config", mount_path = "/etc/rtcedge", config_map = kubernetes_config_map_v1.this.metadata[0].name, claim = null, secret_key = null, secret = null }], var.volumes)
}

resource "kubernetes_config_map_v1" "this" {
  metadata {
    name      = "rtcedge-${var.name}"
    namespace = var.namespace
    labels    = var.labels
  }
  data = {
    "config.yaml" = var.config_yaml != null ? var.config_yaml : yamlencode(var.config)
  }
}

resource "kubernetes_deployment_v1" "this" {
  count = var.service_name == null ? 1 : 0
  metadata {
    name      = var.name
    namespace = var.namespace
    labels    = var.labels
  }
  spec {
    replicas = var.replicas
    selector {
      match_labels = var.labels
    }
    dynamic "strategy" {
      for_each = var.start_before_stop ? [1] : []
      content {
        type = "RollingUpdate"
        rolling_update {
          max_unavailable = "0"
          max_surge       = "1"
        }
      }
    }
    template {
      metadata {
        labels      = local.pod_labels
        annotations = local.annotations
      }
      spec {
        termination_grace_period_seconds = var.termination_grace_seconds

        dynamic "affinity" {
          for_each = var.spread_over_nodes ? [1] : []
          content {
            pod_anti_affinity {
              preferred_during_scheduling_ignored_during_execution {
                weight = 100
                pod_affinity_term {
                  topology_key = "kubernetes.io/hostname"
                  label_selector {
                    match_labels = var.labels
                  }
                }
              }
            }
          }
        }

        # The key issuer (docs/operations.md, "Deployment authority"): it
        # holds the cluster's authority secret, writes only this pod's own
        # keys (pod ID from the StatefulSet ordinal) into an in-memory
        # volume, and exits; the role's container never sees the secret.
        dynamic "init_container" {
          for_each = var.key_issuer == null ? [] : [var.key_issuer]
          content {
            name  = "keys"
            image = var.image
            args  = ["keys", "pod", "-cluster", tostring(init_container.value.cluster), "-out", "/run/rtcedge-keys/pod.yaml"]

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
              name = "RTCEDGE_AUTHORITY_KEYS"
              value_from {
                secret_key_ref {
                  name = var.secret_name
                  key  = init_container.value.secret_key
                }
              }
            }

            volume_mount {
              name       = "pod-keys"
              mount_path = "/run/rtcedge-keys"
            }
          }
        }

        container {
          name  = var.name
          image = var.image
          args  = [var.name, "-config", "/etc/rtcedge/config.yaml"]

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
          dynamic "env" {
            for_each = var.resources == null ? [] : ["GOMAXPROCS"]
            content {
              name = "GOMAXPROCS"
              value_from {
                resource_field_ref {
                  resource = "requests.cpu"
                  divisor  = "1"
                }
              }
            }
          }

          dynamic "env" {
            for_each = var.key_issuer == null ? [] : ["RTCEDGE_POD_KEYS"]
            content {
              name  = env.value
              value = "/run/rtcedge-keys/pod.yaml"
            }
          }

          dynamic "env" {
            for_each = var.secret_keys
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

          dynamic "port" {
            for_each = var.ports
            content {
              name           = port.value.name
              container_port = port.value.port
              protocol       = port.value.protocol
            }
          }

          readiness_probe {
            http_get {
              path = "/readyz"
              port = "metrics"
            }
            period_seconds    = var.readiness_period_seconds
            failure_threshold = var.readiness_failure_threshold
          }
          liveness_probe {
            http_get {
              path = "/livez"
              port = "metrics"
            }
            period_seconds    = 10
            failure_threshold = 3
          }

          dynamic "resources" {
            for_each = var.resources == null ? [] : [var.resources]
            content {
              requests = resources.value.requests
              limits   = resources.value.limits
            }
          }

          dynamic "volume_mount" {
            for_each = var.key_issuer == null ? [] : ["pod-keys"]
            content {
              name       = volume_mount.value
              mount_path = "/run/rtcedge-keys"
              read_only  = true
            }
          }

          dynamic "volume_mount" {
            for_each = local.volumes
            content {
              name       = volume_mount.value.name
              mount_path = volume_mount.value.mount_path
              read_only  = true
            }
          }
        }

        dynamic "volume" {
          for_each = var.key_issuer == null ? [] : ["pod-keys"]
          content {
            name = volume.value
            empty_dir {
              medium     = "Memory"
              size_limit = "1Mi"
            }
          }
        }

        dynamic "volume" {
          for_each = local.volumes
          content {
            name = volume.value.name
            dynamic "config_map" {
              for_each = volume.value.config_map == null ? [] : [volume.value.config_map]
              content {
                name = config_map.value
              }
            }
            dynamic "persistent_volume_claim" {
              for_each = volume.value.claim == null ? [] : [volume.value.claim]
              content {
                claim_name = persistent_volume_claim.value
                read_only  = true
              }
            }
            # One key of a Secret as a file of that name: the kubelet
            # swaps it in place when the Secret changes, and the node
            # re-reads it (authority.file) without a restart.
            dynamic "secret" {
              for_each = volume.value.secret_key == null ? [] : [volume.value.secret_key]
              content {
                secret_name  = var.secret_name
                default_mode = "0400"
                items {
                  key  = secret.value
                  path = secret.value
                }
              }
            }
            # A whole Secret of its own (a kubernetes.io/tls certificate),
            # each key a file.
            dynamic "secret" {
              for_each = volume.value.secret == null ? [] : [volume.value.secret]
              content {
                secret_name  = secret.value
                default_mode = "0400"
              }
            }
          }
        }
      }
    }
  }
}

resource "kubernetes_stateful_set_v1" "this" {
  count = var.service_name == null ? 0 : 1
  metadata {
    name      = var.name
    namespace = var.namespace
    labels    = var.labels
  }
  spec {
    service_name = var.service_name
    replicas     = var.replicas
    # Pods are independent; start and replace them all at once.
    pod_management_policy = "Parallel"
    selector {
      match_labels = var.labels
    }
    template {
      metadata {
        labels      = local.pod_labels
        annotations = local.annotations
      }
      spec {
        termination_grace_period_seconds = var.termination_grace_seconds

        dynamic "affinity" {
          for_each = var.spread_over_nodes ? [1] : []
          content {
            pod_anti_affinity {
              preferred_during_scheduling_ignored_during_execution {
                weight = 100
                pod_affinity_term {
                  topology_key = "kubernetes.io/hostname"
                  label_selector {
                    match_labels = var.labels
                  }
                }
              }
            }
          }
        }

        # The key issuer (docs/operations.md, "Deployment authority"): it
        # holds the cluster's authority secret, writes only this pod's own
        # keys (pod ID from the StatefulSet ordinal) into an in-memory
        # volume, and exits; the role's container never sees the secret.
        dynamic "init_container" {
          for_each = var.key_issuer == null ? [] : [var.key_issuer]
          content {
            name  = "keys"
            image = var.image
            args  = ["keys", "pod", "-cluster", tostring(init_container.value.cluster), "-out", "/run/rtcedge-keys/pod.yaml"]

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
              name = "RTCEDGE_AUTHORITY_KEYS"
              value_from {
                secret_key_ref {
                  name = var.secret_name
                  key  = init_container.value.secret_key
                }
              }
            }

            volume_mount {
              name       = "pod-keys"
              mount_path = "/run/rtcedge-keys"
            }
          }
        }

        container {
          name  = var.name
          image = var.image
          args  = [var.name, "-config", "/etc/rtcedge/config.yaml"]

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
          dynamic "env" {
            for_each = var.resources == null ? [] : ["GOMAXPROCS"]
            content {
              name = "GOMAXPROCS"
              value_from {
                resource_field_ref {
                  resource = "requests.cpu"
                  divisor  = "1"
                }
              }
            }
          }

          dynamic "env" {
            for_each = var.key_issuer == null ? [] : ["RTCEDGE_POD_KEYS"]
            content {
              name  = env.value
              value = "/run/rtcedge-keys/pod.yaml"
            }
          }

          dynamic "env" {
            for_each = var.secret_keys
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

          dynamic "port" {
            for_each = var.ports
            content {
              name           = port.value.name
              container_port = port.value.port
              protocol       = port.value.protocol
            }
          }

          readiness_probe {
            http_get {
              path = "/readyz"
              port = "metrics"
            }
            period_seconds    = var.readiness_period_seconds
            failure_threshold = var.readiness_failure_threshold
          }
          liveness_probe {
            http_get {
              path = "/livez"
              port = "metrics"
            }
            period_seconds    = 10
            failure_threshold = 3
          }

          dynamic "resources" {
            for_each = var.resources == null ? [] : [var.resources]
            content {
              requests = resources.value.requests
              limits   = resources.value.limits
            }
          }

          dynamic "volume_mount" {
            for_each = var.key_issuer == null ? [] : ["pod-keys"]
            content {
              name       = volume_mount.value
              mount_path = "/run/rtcedge-keys"
              read_only  = true
            }
          }

          dynamic "volume_mount" {
            for_each = local.volumes
            content {
              name       = volume_mount.value.name
              mount_path = volume_mount.value.mount_path
              read_only  = true
            }
          }
        }

        dynamic "volume" {
          for_each = var.key_issuer == null ? [] : ["pod-keys"]
          content {
            name = volume.value
            empty_dir {
              medium     = "Memory"
              size_limit = "1Mi"
            }
          }
        }

        dynamic "volume" {
          for_each = local.volumes
          content {
            name = volume.value.name
            dynamic "config_map" {
              for_each = volume.value.config_map == null ? [] : [volume.value.config_map]
              content {
                name = config_map.value
              }
            }
            dynamic "persistent_volume_claim" {
              for_each = volume.value.claim == null ? [] : [volume.value.claim]
              content {
                claim_name = persistent_volume_claim.value
                read_only  = true
              }
            }
            # One key of a Secret as a file of that name: the kubelet
            # swaps it in place when the Secret changes, and the node
            # re-reads it (authority.file) without a restart.
            dynamic "secret" {
              for_each = volume.value.secret_key == null ? [] : [volume.value.secret_key]
              content {
                secret_name  = var.secret_name
                default_mode = "0400"
                items {
                  key  = secret.value
                  path = secret.value
                }
              }
            }
            # A whole Secret of its own (a kubernetes.io/tls certificate),
            # each key a file.
            dynamic "secret" {
              for_each = volume.value.secret == null ? [] : [volume.value.secret]
              content {
                secret_name  = secret.value
                default_mode = "0400"
              }
            }
          }
        }
      }
    }
  }
}

# A voluntary disruption (a node upgrade, the autoscaler) takes one pod of
# the role at a time: the others keep serving while the evicted one drains
# (evicting both transceivers or both cluster relays at once would end every
# call of a region).
resource "kubernetes_pod_disruption_budget_v1" "this" {
  metadata {
    name      = var.name
    namespace = var.namespace
    labels    = var.labels
  }
  spec {
    max_unavailable = "1"
    selector {
      match_labels = var.labels
    }
  }
}
