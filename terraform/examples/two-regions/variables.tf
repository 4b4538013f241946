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

variable "image" {
  description = "The rtcedge image."
  type        = string
  default     = "registry.example.com/rtcedge:latest"
}
