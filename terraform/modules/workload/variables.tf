# Inputs of one rtcedge role's pods. Everything a role's pods share with the
# other roles' (the image's user, POD_IP, probes on the metrics port, the
# config mount) is written once in main.tf; the rest is set here.

variable "name" {
  description = "The role (the rtcedge subcommand): names the container, the workload, its budget and, as rtcedge-<name>, its ConfigMap."
  type        = string

  # A StatefulSet's pods carry the label controller-revision-hash =
  # <name>-<10 characters>, a label value of at most 63: 52 leaves room.
  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$", var.name))
    error_message = "name must be a DNS-1123 label of at most 52 characters (lowercase letters, digits or '-'): it names the container and the workload, whose pods' controller-revision-hash label adds 11."
  }
}

variable "namespace" {
  description = "Namespace of the role's resources."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.namespace))
    error_message = "namespace must be a DNS-1123 label: at most 63 lowercase letters, digits or '-'."
  }
}

variable "labels" {
  description = "The role's labels: on every resource, and what the workload and its budget select pods by."
  type        = map(string)

  validation {
    condition     = alltrue([for k, v in var.labels : can(regex("^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", k)) && !can(regex("^[^/]{254,}/", k)) && can(regex("^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$", v))])
    error_message = "Every label must have a qualified name as key and a label value (at most 63 letters, digits, '-', '_' or '.') as value."
  }
}

variable "pod_labels" {
  description = "More labels on the pods only (a gossip pool's)."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.pod_labels : can(regex("^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", k)) && !can(regex("^[^/]{254,}/", k)) && can(regex("^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$", v))])
    error_message = "Every pod label must have a qualified name as key and a label value (at most 63 letters, digits, '-', '_' or '.') as value."
  }
}

variable "annotations" {
  description = "More pod annotations (the config's and the read Secret keys' checksums are always there)."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k in keys(var.annotations) : can(regex("^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", k)) && !can(regex("^[^/]{254,}/", k))])
    error_message = "Every annotation key must be a Kubernetes qualified name."
  }
}

variable "image" {
  description = "The rtcedge image."
  type        = string
}

variable "config" {
  description = "The role's config file (deploy/examples format), mounted at /etc/rtcedge/config.yaml."
  type        = any
}

variable "config_yaml" {
  description = "The role's config file as text, used instead of yamlencode(config) when set: for what yamlencode cannot write (a map keyed by integers)."
  type        = string
  default     = null
}

variable "replicas" {
  description = "Pods of the role."
  type        = number
}

variable "service_name" {
  description = "Set: the role runs as a StatefulSet (pod names carry ordinals) governed by this Service; null: a Deployment."
  type        = string
  default     = null
}

variable "start_before_stop" {
  description = "A Deployment's rollout keeps every replica until its successor is ready (max_unavailable 0, max_surge 1)."
  type        = bool
  default     = false
}

variable "spread_over_nodes" {
  description = "Prefer one replica per node, so losing a node loses at most one replica."
  type        = bool
  default     = false
}

variable "termination_grace_seconds" {
  description = "The pod's termination grace period: its drain plus a margin."
  type        = number
  default     = 30
}

variable "secret_name" {
  description = "Secret the role's keys come from."
  type        = string

  validation {
    condition     = length(var.secret_name) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", var.secret_name))
    error_message = "secret_name must be a DNS-1123 subdomain of at most 253 characters."
  }
}

variable "secret_keys" {
  description = "Keys of secret_name the container gets as environment variables of the same name: the role's own only."
  type        = list(string)

  validation {
    condition     = alltrue([for k in var.secret_keys : can(regex("^[A-Za-z_][A-Za-z0-9_]{0,252}$", k))])
    error_message = "Every secret key must be an environment variable name (letters, digits, '_') of at most 253 characters."
  }
}

variable "secret_hashes" {
  description = "SHA-256 of each value of secret_name, by key, when Terraform manages that Secret. The pod template then carries rtcedge.example.com/secret-sha, a checksum over the keys its pods read (secret_keys, the volumes' secret_key, the key issuer's): changing one of those keys rolls these pods, changing another does not. null = the Secret is managed out of band: no checksum, and a change takes a roll by hand (docs/deploy.md, \"Key rotation\")."
  type        = map(string)
  default     = null
}

variable "key_issuer" {
  description = "When set, an init container (rtcedge keys pod) derives the pod's own keys for cluster from secret_key of secret_name (the cluster's authority secret) into an in-memory volume, and the container gets RTCEDGE_POD_KEYS, never the secret (docs/operations.md, \"Deployment authority\"). null = none."
  type = object({
    cluster    = number
    secret_key = string
  })
  default = null
}

variable "ports" {
  description = "The container's ports, in order."
  type = list(object({
    name     = string
    port     = number
    protocol = string
  }))

  # Port names are IANA service names: at most 15 lowercase letters, digits
  # or '-', at least one letter, no '--' (Services refer to them by name).
  validation {
    condition     = alltrue([for p in var.ports : can(regex("^[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$", p.name)) && can(regex("[a-z]", p.name)) && !can(regex("--", p.name)) && p.port >= 1 && p.port <= 65535 && contains(["TCP", "UDP", "SCTP"], p.protocol)])
    error_message = "Every port needs a name of at most 15 lowercase letters, digits or '-' (at least one letter, no '--'), a number in 1..65535 and a protocol of TCP, UDP or SCTP."
  }
}

variable "readiness_period_seconds" {
  description = "How often /readyz is asked."
  type        = number
  default     = 5
}

variable "readiness_failure_threshold" {
  description = "Failed /readyz answers that take the pod out of its Services."
  type        = number
  default     = 3
}

variable "resources" {
  description = "Requests and limits of the container; when set, GOMAXPROCS follows requests.cpu. null = none."
  type = object({
    requests = map(string)
    limits   = map(string)
  })
  default = null
}

variable "volumes" {
  description = "More read-only volumes after the config: each a ConfigMap, a PersistentVolumeClaim, one key (secret_key) of secret_name as a file of that name, or a whole Secret of its own (secret: a certificate), mounted at mount_path."
  type = list(object({
    name       = string
    mount_path = string
    config_map = optional(string)
    claim      = optional(string)
    secret_key = optional(string)
    secret     = optional(string)
  }))
  default = []

  validation {
    condition     = alltrue([for v in var.volumes : can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", v.name)) && (v.config_map == null ? true : length(v.config_map) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", v.config_map))) && (v.claim == null ? true : length(v.claim) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", v.claim))) && (v.secret == null ? true : length(v.secret) <= 253 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", v.secret)))])
    error_message = "Every volume name must be a DNS-1123 label (at most 63 characters), and every ConfigMap, claim or Secret a DNS-1123 subdomain (at most 253)."
  }
}
