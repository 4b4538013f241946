# The root module `make test-k8s` applies to a bare kube-apiserver: one
# region and one POP (with its SIP front) of terraform/modules, with names at the longest the
# modules' validations accept (the region's namespace rtcedge-<55 characters>,
# the POP's rtcedge-pop-<51 characters>, both 63), the Secrets managed here
# and derived from key_generation (every key) and issuer_generation (the key
# issuer's only), so that bumping one is a rotation. The program copies this
# file next to a link "modules" to terraform/modules.

terraform {
  required_version = ">= 1.9"
  required_providers {
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = "~> 2.30"
    }
  }
}

variable "kubeconfig" {
  description = "The test cluster's kubeconfig."
  type        = string
}

variable "region" {
  description = "The region's name: 55 characters, the most its namespace allows."
  type        = string
  default     = "region-at-the-longest-name-its-namespace-takes-55-chars"
}

variable "pop_name" {
  description = "The POP's name: 51 characters, the most its namespace allows."
  type        = string
  default     = "pop-at-the-longest-name-its-namespace-takes-51-char"
}

variable "cluster_id" {
  description = "The region's cluster ID."
  type        = number
  default     = 1
}

variable "image_version" {
  description = "The image tag: changing it is an upgrade, every workload rolls in place."
  type        = string
  default     = "v1.0.0"
}

variable "key_generation" {
  description = "Generation of every key: bumping it rotates them all."
  type        = number
  default     = 1
}

variable "sip_trunk_cidr" {
  description = "The first trunk's source CIDR (a malformed one must fail plan)."
  type        = string
  default     = "203.0.113.0/24"
}

variable "sip_tls_generation" {
  description = "Generation of the SIP front's certificate: bumping it is a renewal, which rolls the front only."
  type        = number
  default     = 1
}

variable "issuer_generation" {
  description = "Generation of the key issuer's authority secret only (rotation step 2)."
  type        = number
  default     = 1
}

provider "kubernetes" {
  config_path = var.kubeconfig
}

locals {
  image = "registry.example.com/rtcedge:${var.image_version}"

  # Stand-ins for `rtcedge keys …` output, in its format: 32 bytes each,
  # derived from the generation so that a bump changes them.
  key = { for k in ["cluster-gossip", "global-gossip", "cluster", "signaling", "pop", "api", "client-secret", "session-api", "sip-password"] :
    k => base64encode(substr(sha256("${k}/${var.key_generation}"), 0, 32))
  }
  issuer_key = base64encode(substr(sha256("cluster/${var.issuer_generation}"), 0, 32))

  region_secrets = {
    RTCEDGE_AUTHORITY_KEYS           = "${var.cluster_id}/${var.key_generation % 16}:${local.key["cluster"]}"
    RTCEDGE_ISSUER_AUTHORITY_KEYS    = "${var.cluster_id}/${var.issuer_generation % 16}:${local.issuer_key}"
    RTCEDGE_CLUSTER_GOSSIP_KEY       = local.key["cluster-gossip"]
    RTCEDGE_GLOBAL_GOSSIP_KEY        = local.key["global-gossip"]
    RTCEDGE_SIGNALING_AUTHORITY_KEYS = "signaling/${var.key_generation % 16}:${local.key["signaling"]}"
    RTCEDGE_API_KEYS                 = local.key["api"]
    RTCEDGE_CLIENT_SECRET_KEY        = local.key["client-secret"]
  }
  pop_secrets = {
    RTCEDGE_AUTHORITY_KEYS       = "${var.cluster_id}/${var.key_generation % 16}:${local.key["cluster"]},pop:1/${var.key_generation % 16}:${local.key["pop"]}"
    RTCEDGE_GLOBAL_GOSSIP_KEY    = local.key["global-gossip"]
    RTCEDGE_SESSION_API_SECRET_1 = local.key["session-api"]
    CARRIER_A_SIP_PASSWORD       = local.key["sip-password"]
  }

  catalogue_yaml = yamlencode({
    default_region = var.region
    regions = [{
      name     = var.region
      location = { lat = 50.11, lon = 8.68 }
      clusters = [{ id = var.cluster_id, name = "${var.region}-1", session_api = "http://rtcedge-session-api:8080" }]
      pops     = [{ id = 1, name = var.pop_name, vip = "192.0.2.10:3478" }]
    }]
  })
}

module "region" {
  source = "./modules/region"

  region             = var.region
  cluster_id         = var.cluster_id
  image              = local.image
  secrets            = local.region_secrets
  catalogue_yaml     = local.catalogue_yaml
  global_gossip_join = ["gossip.global.example.net:7947"]
  trusted_proxies    = ["192.0.2.0/24"]
  route_cache_url    = module.pop.redis_url
  network_policy = {
    remote_pod_cidrs     = ["198.51.100.0/24"]
    monitoring_namespace = "monitoring"
  }
}

module "pop" {
  source = "./modules/pop"

  region             = var.region
  pop_id             = 1
  name               = var.pop_name
  image              = local.image
  secrets            = local.pop_secrets
  load_balancer_ip   = "192.0.2.10"
  global_gossip_join = ["gossip.global.example.net:7947"]
  network_policy = {
    remote_pod_cidrs     = ["198.51.100.0/24"]
    monitoring_namespace = "monitoring"
  }

  sip = {
    catalogue_yaml       = local.catalogue_yaml
    load_balancer_ip     = "192.0.2.11"
    contact_host         = "sip.example.com"
    session_api_clusters = [var.cluster_id]
    session_api_cidrs    = ["198.51.100.0/24"]
    trunks = [
      { name = "carrier-a", source_cidrs = [var.sip_trunk_cidr], digest_user = "rtcedge", digest_password_key = "CARRIER_A_SIP_PASSWORD" },
      { name = "carrier-b", source_cidrs = ["2001:db8::/32"], media_cidrs = ["2001:db8::/32", "198.51.100.0/24"], pop = "", session = { voice = "alloy" } },
    ]
  }
  # Stand-ins for a PEM chain and key: the API server checks a TLS
  # Secret's keys, not their contents.
  sip_tls = {
    certificate = "certificate ${var.sip_tls_generation}"
    private_key = "key ${var.sip_tls_generation}"
  }
}
