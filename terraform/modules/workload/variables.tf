# Inputs of one rtcedge role's pods. Everything a role's pods share with the
# other roles' (the image's user, POD_IP, probes on the metrics port, the
# config mount) is written once in main.tf; the rest is set here.

variable "name" {
  description = "The role (the rtcedge subcommand): names the container, the workload, its budget and, as rtcedge-<name>, its ConfigMap."
  type        = string
}

variable "namespace" {
  description = "Namespace of the role's resources."
  type        = string
}

variable "labels" {
  description = "The role's labels: on every resource, and what the workload and its budget select pods by."
  type        = map(string)
}

variable "pod_labels" {
  description = "More labels on the pods only (a gossip pool's)."
  type        = map(string)
  default     = {}
}

variable "annotations" {
  description = "More pod annotations (the config's checksum is always one)."
  type        = map(string)
  default     = {}
}

variable "image" {
  description = "The rtcedge image."
  type        = string
}

variable "config" {
  description = "The role's config file (deploy/examples format), mounted at /etc/rtcedge/config.yaml."
  type        = any
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
}

variable "secret_keys" {
  description = "Keys of secret_name the container gets as environment variables of the same name: the role's own only."
  type        = list(string)
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
  description = "More read-only volumes after the config: each a ConfigMap, a PersistentVolumeClaim, or one key (secret_key) of secret_name as a file of that name, mounted at mount_path."
  type = list(object({
    name       = string
    mount_path = string
    config_map = optional(string)
    claim      = optional(string)
    secret_key = optional(string)
  }))
  default = []
}
