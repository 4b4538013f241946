variable "cloudflare_account_id" {
  description = "Cloudflare account ID."
  type        = string
}

variable "cloudflare_zone_id" {
  description = "Zone ID of example.com."
  type        = string
}

variable "kubeconfig" {
  description = "kubeconfig file with one context per region."
  type        = string
  default     = "~/.kube/config"
}

variable "kube_contexts" {
  description = "kubeconfig context by region."
  type        = map(string)
  default = {
    "eu-central" = "eu-central"
    "us-east"    = "us-east"
  }
}

variable "image_repository" {
  description = "Where the image was pushed: `make image IMAGE_REPO=<this>` tags it <this>:<version> (docs/deploy.md)."
  type        = string
  default     = "registry.example.com/rtcedge"
}

variable "image_version" {
  description = "The image's version tag, `git describe --tags --always --dirty` of the build (make image's VERSION). Changing it rolls every workload."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$", var.image_version)) && var.image_version != "latest"
    error_message = "image_version is the tag make image printed (e.g. v1.2.0 or v1.2.0-3-gabc1234), not latest."
  }
}
