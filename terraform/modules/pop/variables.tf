# Inputs of one global relay POP: the public UDP ingress clients send media to.

variable "region" {
  description = "Region the POP belongs to (catalogue name). It labels every object (rtcedge.example.com/region)."
  type        = string

  # The Kubernetes API server refuses these at apply; checked here so that
  # plan does (docs/deploy.md, "Names and their limits").
  validation {
    condition     = can(regex("^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", var.region))
    error_message = "region \"${var.region}\" labels every object: it must be a Kubernetes label value, at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit."
  }
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
  description = "The POP's name in the catalogue, e.g. fra. It labels every object (rtcedge.example.com/pop) and, with namespace unset, names the namespace rtcedge-pop-<name>."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", var.name))
    error_message = "name \"${var.name}\" labels every object: it must be a Kubernetes label value, at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit."
  }
  validation {
    condition     = var.namespace != null ? true : can(regex("^[a-z0-9]([-a-z0-9]{0,49}[a-z0-9])?$", var.name))
    error_message = "name \"${var.name}\" names the namespace rtcedge-pop-<name> (namespace is unset), a DNS-1123 label of at most 63 characters: name must then be at most 51 lowercase letters, digits or '-', starting and ending with a letter or digit; or set namespace."
  }
}

variable "namespace" {
  description = "Namespace of the POP; null = rtcedge-pop-<name>."
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
  description = "Secret holding RTCEDGE_AUTHORITY_KEYS (the authority secrets of every cluster this POP serves, rtcedge keys cluster, and this POP's own secret, rtcedge keys pop, which proves its relays in the global pool; docs/operations.md) and RTCEDGE_GLOBAL_GOSSIP_KEY (the global pool), and RTCEDGE_REDIS_URL when redis_url is not managed here."
  type        = string
  default     = "rtcedge-secrets"

  validation {
    condition     = try(length(var.secret_name) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", var.secret_name)), false)
    error_message = "secret_name must be a Kubernetes object name (DNS-1123 subdomain): at most 253 lowercase letters, digits, '-' or '.'."
  }
}

variable "secrets" {
  description = "When set, the module creates secret_name with these keys; null = use a Secret created out of band."
  type        = map(string)
  default     = null
  sensitive   = true

  validation {
    condition     = var.secrets == null ? true : alltrue([for k in keys(var.secrets) : can(regex("^[-._a-zA-Z0-9]{1,253}$", k))])
    error_message = "Every key of secrets must be a Secret data key: at most 253 letters, digits, '-', '_' or '.'."
  }
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

  validation {
    condition     = alltrue([for k in keys(var.service_annotations) : can(regex("^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", k)) && !can(regex("^[^/]{254,}/", k))])
    error_message = "Every key of service_annotations must be a Kubernetes qualified name: an optional DNS subdomain prefix (at most 253 characters) and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit."
  }
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

  # It names a namespace (a kubernetes.io/metadata.name selector).
  validation {
    condition     = var.network_policy.monitoring_namespace == null ? true : can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.network_policy.monitoring_namespace))
    error_message = "network_policy.monitoring_namespace must be a namespace name (DNS-1123 label): at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit."
  }
}

variable "sip" {
  description = <<-EOT
    The POP's SIP front (docs/sip.md, "Deploy"); null = none. Carriers send
    SIP to its own LoadBalancer Service (load_balancer_ip: UDP and TCP 5060,
    TLS 5061) and RTP to this POP's VIP, which the answers name: each trunk's
    calls are pinned to this POP unless its pop says otherwise ("" = the POP
    nearest the carrier). catalogue_yaml is the region catalogue (the same as
    the regions'); session_api_clusters the clusters whose session API
    secrets the front sends (RTCEDGE_SESSION_API_SECRET_<id> of secret_name);
    session_api_cidrs and session_api_ports where it may reach those APIs
    outside this Kubernetes cluster (in it: the cluster relays' port 8080).
    A trunk's digest password is the key digest_password_key of secret_name.
    TLS: the certificate from tls_secret_name (a kubernetes.io/tls Secret
    managed elsewhere, e.g. by cert-manager: its renewal takes a roll by
    hand) or from var.sip_tls (a Secret this module manages: a change rolls
    the front's pods).
  EOT
  type = object({
    replicas              = optional(number, 2)
    catalogue_yaml        = string
    load_balancer_ip      = optional(string)
    service_annotations   = optional(map(string), {})
    contact_host          = optional(string, "")
    tls_secret_name       = optional(string)
    geoip_claim_name      = optional(string)
    session_api_clusters  = optional(list(number), [])
    session_api_cidrs     = optional(list(string), [])
    session_api_ports     = optional(list(number), [8080, 443])
    max_dialogs           = optional(number, 10000)
    source_rate           = optional(number, 20)
    source_burst          = optional(number, 40)
    invite_timeout        = optional(string, "8s")
    drain_timeout_seconds = optional(number, 60)
    resources = optional(object({
      requests = map(string)
      limits   = map(string)
      }), {
      requests = { cpu = "500m", memory = "256Mi" }
      limits   = { memory = "512Mi" }
    })
    trunks = list(object({
      name                = string
      source_cidrs        = list(string)
      media_cidrs         = optional(list(string))
      digest_user         = optional(string)
      digest_password_key = optional(string)
      max_calls           = optional(number, 100)
      calls_per_second    = optional(number, 10)
      call_burst          = optional(number, 20)
      pop                 = optional(string)
      session             = optional(map(string), {})
    }))
  })
  default = null

  validation {
    condition     = var.sip == null ? true : var.sip.replicas >= 1 && length(var.sip.trunks) >= 1 && length(distinct([for t in var.sip.trunks : t.name])) == length(var.sip.trunks)
    error_message = "sip needs at least 1 replica and at least one trunk, each trunk with its own name."
  }
  validation {
    condition     = var.sip == null ? true : alltrue([for t in var.sip.trunks : length(t.source_cidrs) > 0 && alltrue([for c in concat(t.source_cidrs, coalesce(t.media_cidrs, [])) : can(cidrhost(c, 0))])])
    error_message = "Every trunk of sip needs source_cidrs, and its source_cidrs and media_cidrs must be CIDRs (203.0.113.0/24, 2001:db8::/32)."
  }
  validation {
    condition     = var.sip == null ? true : alltrue([for t in var.sip.trunks : (t.digest_user == null) == (t.digest_password_key == null) && (t.digest_password_key == null ? true : can(regex("^[A-Za-z_][A-Za-z0-9_]{0,252}$", t.digest_password_key)))])
    error_message = "A trunk's digest_user and digest_password_key go together; digest_password_key is a key of secret_name given to the front as an environment variable of that name: at most 253 letters, digits or '_', not starting with a digit."
  }
  validation {
    condition     = var.sip == null ? true : alltrue([for id in var.sip.session_api_clusters : id >= 1 && id <= 65535 && floor(id) == id])
    error_message = "sip.session_api_clusters holds cluster IDs, integers in 1..65535."
  }
  validation {
    condition     = var.sip == null ? true : alltrue([for n in compact([var.sip.tls_secret_name, var.sip.geoip_claim_name]) : length(n) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", n))])
    error_message = "sip.tls_secret_name and sip.geoip_claim_name must be Kubernetes object names (DNS-1123 subdomains): at most 253 lowercase letters, digits, '-' or '.'."
  }
  validation {
    condition     = var.sip == null ? true : alltrue([for k in keys(var.sip.service_annotations) : can(regex("^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", k)) && !can(regex("^[^/]{254,}/", k))])
    error_message = "Every key of sip.service_annotations must be a Kubernetes qualified name: an optional DNS subdomain prefix (at most 253 characters) and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit."
  }
  validation {
    condition     = var.sip == null ? true : alltrue([for c in var.sip.session_api_cidrs : can(cidrhost(c, 0))]) && alltrue([for p in var.sip.session_api_ports : p >= 1 && p <= 65535])
    error_message = "sip.session_api_cidrs must be CIDRs and sip.session_api_ports port numbers."
  }
}

variable "sip_tls" {
  description = "The SIP front's TLS certificate chain and key (PEM) when this module manages their Secret (rtcedge-sip-tls; a change rolls the front's pods); null = sip.tls_secret_name, or no TLS listener when that is null too."
  type = object({
    certificate = string
    private_key = string
  })
  default   = null
  sensitive = true

  validation {
    condition     = nonsensitive(var.sip_tls == null) ? true : var.sip != null && try(var.sip.tls_secret_name == null, false)
    error_message = "sip_tls goes with sip, and not with sip.tls_secret_name: the certificate comes from one Secret."
  }
}
