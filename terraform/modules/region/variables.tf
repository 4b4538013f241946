# Inputs of one region: a transceiver cluster (StatefulSet), its cluster
# relays (session API front), and the region's signaling fronts.

variable "region" {
  description = "Region name as in the catalogue, e.g. eu-central. It labels every object (rtcedge.example.com/region) and, with namespace unset, names the namespace rtcedge-<region>."
  type        = string

  # The Kubernetes API server refuses these at apply; checked here so that
  # plan does (docs/deploy.md, "Names and their limits").
  validation {
    condition     = can(regex("^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", var.region))
    error_message = "region \"${var.region}\" labels every object: it must be a Kubernetes label value, at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit."
  }
  validation {
    condition     = var.namespace != null ? true : can(regex("^[a-z0-9]([-a-z0-9]{0,53}[a-z0-9])?$", var.region))
    error_message = "region \"${var.region}\" names the namespace rtcedge-<region> (namespace is unset), a DNS-1123 label of at most 63 characters: region must be at most 55 lowercase letters, digits or '-', starting and ending with a letter or digit; or set namespace."
  }
}

variable "cluster_id" {
  description = "The cluster's ID in the catalogue (1..65535); carried in routing tokens."
  type        = number

  validation {
    condition     = var.cluster_id >= 1 && var.cluster_id <= 65535 && floor(var.cluster_id) == var.cluster_id
    error_message = "cluster_id must be an integer in 1..65535."
  }
}

variable "namespace" {
  description = "Namespace the region's workloads run in; null = rtcedge-<region>."
  type        = string
  default     = null

  validation {
    condition     = var.namespace == null ? true : can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.namespace))
    error_message = "namespace must be a DNS-1123 label: at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit."
  }
}

variable "create_namespace" {
  description = "Create the namespace (false when it is managed elsewhere)."
  type        = bool
  default     = true
}

variable "image" {
  description = "The rtcedge image, <repository>:<version> as `make image` tags it (rtcedge:$(git describe)), pushed to a registry the cluster pulls from."
  type        = string

  validation {
    # A tag or digest after the last path element, and not the moving
    # "latest": a rolling upgrade needs a new reference to roll to.
    condition     = can(regex("^[^\\s]+/?[^/:@\\s]+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$", var.image)) && !endswith(var.image, ":latest")
    error_message = "image must be <repository>:<version> (or @sha256:<digest>), e.g. registry.example.com/rtcedge:v1.2.0, not :latest."
  }
}

variable "secret_name" {
  description = "Secret holding RTCEDGE_AUTHORITY_KEYS (this cluster's authority secret, rtcedge keys cluster: the cluster relays read it as a file, reloaded on change), RTCEDGE_ISSUER_AUTHORITY_KEYS (the same secrets, current first as pods should use them: only the pods' key-issuer init container reads it, the transceiver container never; docs/operations.md), RTCEDGE_CLUSTER_GOSSIP_KEY (the cluster pool), RTCEDGE_GLOBAL_GOSSIP_KEY (the global pool), RTCEDGE_SIGNALING_AUTHORITY_KEYS (signaling's secret, rtcedge keys signaling: signaling only), RTCEDGE_API_KEYS and RTCEDGE_CLIENT_SECRET_KEY."
  type        = string
  default     = "rtcedge-secrets"

  validation {
    condition     = try(length(var.secret_name) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", var.secret_name)), false)
    error_message = "secret_name must be a Kubernetes object name (DNS-1123 subdomain): at most 253 lowercase letters, digits, '-' or '.'."
  }
}

variable "secrets" {
  description = "When set, the module creates secret_name with these keys; leave null to use a Secret created out of band (keeps secrets out of Terraform state)."
  type        = map(string)
  default     = null
  sensitive   = true

  validation {
    condition     = var.secrets == null ? true : alltrue([for k in keys(var.secrets) : can(regex("^[-._a-zA-Z0-9]{1,253}$", k))])
    error_message = "Every key of secrets must be a Secret data key: at most 253 letters, digits, '-', '_' or '.'."
  }
}

variable "log_level" {
  description = "Log level of every role."
  type        = string
  default     = "info"
}

variable "catalogue_yaml" {
  description = "The region catalogue (geo/README.md format), the same in every region."
  type        = string
}

variable "global_gossip_join" {
  description = "Seeds of the global gossip pool (host:port), e.g. [\"gossip.global.example.net:7947\"]."
  type        = list(string)
}

variable "global_pool_public_keys" {
  description = "Public keys of the global pool (rtcedge keys public over every cluster's, POP's and signaling's secret: relay-pub:, pop-pub:, signaling-pub/ specs). Signaling then believes a cluster relay or global relay only on its own cluster's or POP's key, and cluster relays believe signaling only on signaling's. Not secret. [] = unchecked (docs/operations.md)."
  type        = list(string)
  default     = []
}

variable "route_cache_url" {
  description = "The route cache the pods write phone calls' route entries to (docs/sip.md, \"Deploy\"; docs/wire.md section 6): the Redis of the POP whose SIP front places calls in this region (modules/pop output redis_url), reachable from the pods; \"\" = none, and phone calls' media cannot open a flow at a global relay."
  type        = string
  default     = ""

  validation {
    condition     = var.route_cache_url == "" || can(regex("^(redis|rediss|unix)://", var.route_cache_url))
    error_message = "route_cache_url must be empty or a redis://, rediss:// or unix:// URL."
  }
}

variable "transceiver_replicas" {
  description = "Transceiver pods in the cluster."
  type        = number
  default     = 2
}

variable "max_sessions" {
  description = "Calls per transceiver pod."
  type        = number
  default     = 1000
}

variable "drain_timeout_seconds" {
  description = "How long a draining transceiver lets calls run; the pod's termination grace period is this plus a margin."
  type        = number
  default     = 600
}

variable "transceiver_resources" {
  description = "Requests and limits of a transceiver container."
  type = object({
    requests = map(string)
    limits   = map(string)
  })
  default = {
    requests = { cpu = "2", memory = "1Gi" }
    limits   = { memory = "2Gi" }
  }
}

variable "clusterrelay_replicas" {
  description = "Cluster relay replicas (stateless; 2+ so one can restart)."
  type        = number
  default     = 2

  validation {
    condition     = var.clusterrelay_replicas >= 2
    error_message = "Run at least 2 cluster relay replicas."
  }
}

variable "signaling_replicas" {
  description = "Signaling replicas in the region."
  type        = number
  default     = 2
}

variable "signaling_service_type" {
  description = "Type of the signaling Service; LoadBalancer when Cloudflare reaches it directly, ClusterIP behind an ingress."
  type        = string
  default     = "ClusterIP"
}

variable "signaling_service_annotations" {
  description = "Annotations of the signaling Service (cloud load balancer settings)."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k in keys(var.signaling_service_annotations) : can(regex("^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", k)) && !can(regex("^[^/]{254,}/", k))])
    error_message = "Every key of signaling_service_annotations must be a Kubernetes qualified name: an optional DNS subdomain prefix (at most 253 characters) and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit."
  }
}

variable "trusted_proxies" {
  description = "CIDRs whose CF-* / X-Forwarded-For headers signaling believes: Cloudflare's published ranges, plus any in-cluster ingress."
  type        = list(string)
}

variable "cors_origins" {
  description = "Browser origins allowed to call signaling."
  type        = list(string)
  default     = []
}

variable "geoip_claim_name" {
  description = "PersistentVolumeClaim holding GeoLite2-City.mmdb, mounted at /var/lib/geoip; null = no database (clients without CF location headers land in the default region)."
  type        = string
  default     = null

  validation {
    condition     = var.geoip_claim_name == null ? true : length(var.geoip_claim_name) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", var.geoip_claim_name))
    error_message = "geoip_claim_name must be a Kubernetes object name (DNS-1123 subdomain): at most 253 lowercase letters, digits, '-' or '.'."
  }
}

variable "network_policy" {
  description = <<-EOT
    Kubernetes NetworkPolicies that admit only the tiers that need each port
    (docs/deploy.md, "Network policies"). Peers in this cluster are matched by
    their rtcedge labels; peers in the deployment's other clusters can only be
    matched by address, so remote_pod_cidrs lists those clusters' pod CIDRs.
    signaling_http_cidrs (e.g. Cloudflare's ranges, when the signaling Service
    is a LoadBalancer that keeps client addresses) and ingress_namespace (an
    ingress controller in front of signaling) admit signaling's HTTP port;
    with neither, that port is open to all. monitoring_namespace (Prometheus)
    and node_cidrs (kubelet probes, on CNIs that police host traffic) admit
    the metrics port.
  EOT
  type = object({
    enabled              = optional(bool, true)
    remote_pod_cidrs     = optional(list(string), [])
    signaling_http_cidrs = optional(list(string), [])
    ingress_namespace    = optional(string)
    monitoring_namespace = optional(string)
    node_cidrs           = optional(list(string), [])
  })
  default = {}

  # Both name namespaces (kubernetes.io/metadata.name selectors).
  validation {
    condition     = alltrue([for ns in [var.network_policy.ingress_namespace, var.network_policy.monitoring_namespace] : ns == null ? true : can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", ns))])
    error_message = "network_policy.ingress_namespace and monitoring_namespace must be namespace names (DNS-1123 labels): at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit."
  }
}
