# Inputs of one global relay POP: the public UDP ingress clients send media to.

variable "region" {
  description = "Region the POP belongs to (catalogue name)."
  type        = string
}

variable "pop_id" {
  description = "The POP's ID in the catalogue (1..65535)."
  type        = number

  validation {
    condition     = var.pop_id >= 1 && var.pop_id <= 65535 && floor(var.pop_id) == var.pop_id
    error_message = "pop_id must be an integer in 1..65535."
  }
}

variable "name" {
  description = "The POP's name in the catalogue, e.g. fra."
  type        = string
}

variable "namespace" {
  description = "Namespace of the POP; null = rtcedge-pop-<name>."
  type        = string
  default     = null
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
  description = "Secret holding RTCEDGE_AUTHORITY_KEYS (the authority secrets of every cluster this POP serves, rtcedge keys cluster, and this POP's own secret, rtcedge keys pop, which proves its relays in the global pool; docs/operations.md) and RTCEDGE_GLOBAL_GOSSIP_KEY (the global pool), and RTCEDGE_REDIS_URL when redis_url is not managed here."
  type        = string
  default     = "rtcedge-secrets"
}

variable "secrets" {
  description = "When set, the module creates secret_name with these keys; null = use a Secret created out of band."
  type        = map(string)
  default     = null
  sensitive   = true
}

variable "replicas" {
  description = "Global relay replicas behind the VIP."
  type        = number
  default     = 2

  validation {
    condition     = var.replicas >= 2
    error_message = "Run at least 2 global relay replicas per POP."
  }
}

variable "public_port" {
  description = "The VIP's fixed UDP port; the catalogue's vip must use the same."
  type        = number
  default     = 3478
}

variable "load_balancer_ip" {
  description = "Reserved public address for the VIP (the catalogue's vip); null = whatever the cloud assigns."
  type        = string
  default     = null
}

variable "service_annotations" {
  description = "Annotations of the UDP LoadBalancer Service (cloud-specific: network load balancer type, health check settings)."
  type        = map(string)
  default     = {}
}

variable "workers" {
  description = "SO_REUSEPORT workers per replica; 0 = one per CPU. Worker i binds internal port internal_port_base+i."
  type        = number
  default     = 0
}

variable "internal_port_base" {
  description = "First internal UDP port (where cluster relays send replies)."
  type        = number
  default     = 3500
}

variable "drain_timeout_seconds" {
  description = "How long a draining replica keeps forwarding existing flows."
  type        = number
  default     = 120
}

variable "global_gossip_join" {
  description = "Seeds of the global gossip pool (host:port)."
  type        = list(string)
}

variable "log_level" {
  description = "Log level."
  type        = string
  default     = "info"
}

variable "redis_enabled" {
  description = "Run a Redis next to the relays as their shared route cache (flows survive a replica restart or rebalance)."
  type        = bool
  default     = true
}

variable "redis_image" {
  description = "Redis image when redis_enabled."
  type        = string
  default     = "redis:7-alpine"
}

variable "resources" {
  description = "Requests and limits of a relay container."
  type = object({
    requests = map(string)
    limits   = map(string)
  })
  default = {
    requests = { cpu = "2", memory = "256Mi" }
    limits   = { memory = "512Mi" }
  }
}

variable "network_policy" {
  description = <<-EOT
    Kubernetes NetworkPolicies that admit only the tiers that need each port
    (docs/deploy.md, "Network policies"): the public media port from anywhere,
    the internal reply ports from cluster relays only, gossip from the global
    pool's tiers, Redis from the relays. Peers in this cluster are matched by
    their rtcedge labels; peers in other clusters by remote_pod_cidrs (their
    pod CIDRs). monitoring_namespace (Prometheus) and node_cidrs (kubelet
    probes, on CNIs that police host traffic) admit the metrics port.
  EOT
  type = object({
    enabled              = optional(bool, true)
    remote_pod_cidrs     = optional(list(string), [])
    monitoring_namespace = optional(string)
    node_cidrs           = optional(list(string), [])
  })
  default = {}
}
