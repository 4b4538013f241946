terraform {
  required_version = ">= 1.9"
  required_providers {
    cloudflare = {
      source  = "cloudflare/cloudflare"
      version = "~> 5.0"
    }
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = "~> 2.30"
    }
  }
}

# The API token comes from $CLOUDFLARE_API_TOKEN (needs Load Balancing
# monitors/pools edit on the account, Load Balancers and DNS edit on the zone).
provider "cloudflare" {}

# One Kubernetes cluster per region; each POP runs in its region's cluster.
provider "kubernetes" {
  alias          = "eu_central"
  config_path    = var.kubeconfig
  config_context = var.kube_contexts["eu-central"]
}

provider "kubernetes" {
  alias          = "us_east"
  config_path    = var.kubeconfig
  config_context = var.kube_contexts["us-east"]
}
