# Two regions (eu-central, us-east), one transceiver cluster and one global
# relay POP each, and the Cloudflare steering for rt.example.com. Every
# address is an example value: replace them with your own (see docs/deploy.md).

locals {
  hostname = "rt.example.com"

  # make image's scheme: <repository>:<version>.
  image = "${var.image_repository}:${var.image_version}"

  # Reserved public addresses of the POP VIPs (documentation range here).
  pops = {
    fra = { id = 1, region = "eu-central", address = "203.0.113.10" }
    iad = { id = 2, region = "us-east", address = "203.0.113.20" }
  }

  regions = {
    "eu-central" = {
      cluster_id = 1
      location   = { lat = 50.11, lon = 8.68 }
      # Public addresses of the region's signaling front (its ingress).
      origins            = ["198.51.100.10"]
      cloudflare_regions = ["WEU", "EEU", "NAF", "SAF", "ME"]
      # Pod CIDR of the region's Kubernetes cluster (routable from the other
      # regions), for the network policies.
      pod_cidr = "10.1.0.0/16"
    }
    "us-east" = {
      cluster_id         = 2
      location           = { lat = 39.04, lon = -77.49 }
      origins            = ["198.51.100.20"]
      cloudflare_regions = ["ENAM", "WNAM", "NSAM", "SSAM"]
      pod_cidr           = "10.2.0.0/16"
    }
  }

  # Steering overrides (geo/README.md): places whose network paths do not
  # follow distance. Signaling applies them; the steering module turns them
  # into Cloudflare country pools, so both steer alike.
  steering_countries = {
    ZA = ["eu-central"] # nearer South America on the map, nearer Europe on the network
  }

  # Seeds of the global pool: a DNS name resolving to cluster relays of every
  # region (pod IPs must be routable between the regions).
  global_gossip_join = ["gossip.global.example.net:7947"]

  # The session API front of each cluster as signaling in every region
  # reaches it (a routable internal name; in-cluster names only work for
  # the local region).
  session_apis = {
    "eu-central" = "http://session-api.eu-central.internal.example.net:8080"
    "us-east"    = "http://session-api.us-east.internal.example.net:8080"
  }

  # The region catalogue (geo/README.md), the same in every region.
  catalogue_yaml = yamlencode({
    default_region = "eu-central"
    steering       = { countries = local.steering_countries }
    regions = [
      for name, r in local.regions : {
        name     = name
        location = r.location
        clusters = [{
          id          = r.cluster_id
          name        = "${name}-1"
          session_api = local.session_apis[name]
        }]
        pops = [
          for pop, p in local.pops : { id = p.id, name = pop, vip = "${p.address}:3478" } if p.region == name
        ]
      }
    ]
  })

  # Cloudflare's published ranges, from the provider (the list changes;
  # every apply refreshes it): signaling believes CF-* headers only from
  # them, and the network policies admit signaling's HTTP port only from
  # them (origin firewalling; docs/deploy.md).
  cloudflare_ranges = concat(data.cloudflare_ip_ranges.cloudflare.ipv4_cidrs, data.cloudflare_ip_ranges.cloudflare.ipv6_cidrs)
  trusted_proxies   = local.cloudflare_ranges

  # Each cluster's network policies admit the other clusters' pods by
  # address.
  remote_pod_cidrs = {
    for name, r in local.regions : name => [for other, o in local.regions : o.pod_cidr if other != name]
  }
}

data "cloudflare_ip_ranges" "cloudflare" {}

module "region_eu_central" {
  source    = "../../modules/region"
  providers = { kubernetes = kubernetes.eu_central }

  region                 = "eu-central"
  cluster_id             = local.regions["eu-central"].cluster_id
  image                  = local.image
  catalogue_yaml         = local.catalogue_yaml
  global_gossip_join     = local.global_gossip_join
  trusted_proxies        = local.trusted_proxies
  cors_origins           = ["https://app.example.com"]
  transceiver_replicas   = 3
  signaling_service_type = "LoadBalancer"
  # fra's SIP front places phone calls here: the pods write their route
  # entries to fra's Redis (same Kubernetes cluster).
  route_cache_url = module.pop_fra.redis_url
  network_policy = {
    remote_pod_cidrs     = local.remote_pod_cidrs["eu-central"]
    signaling_http_cidrs = local.cloudflare_ranges
    monitoring_namespace = "monitoring"
  }
}

module "region_us_east" {
  source    = "../../modules/region"
  providers = { kubernetes = kubernetes.us_east }

  region                 = "us-east"
  cluster_id             = local.regions["us-east"].cluster_id
  image                  = local.image
  catalogue_yaml         = local.catalogue_yaml
  global_gossip_join     = local.global_gossip_join
  trusted_proxies        = local.trusted_proxies
  cors_origins           = ["https://app.example.com"]
  signaling_service_type = "LoadBalancer"
  network_policy = {
    remote_pod_cidrs     = local.remote_pod_cidrs["us-east"]
    signaling_http_cidrs = local.cloudflare_ranges
    monitoring_namespace = "monitoring"
  }
}

module "pop_fra" {
  source    = "../../modules/pop"
  providers = { kubernetes = kubernetes.eu_central }

  region             = local.pops.fra.region
  pop_id             = local.pops.fra.id
  name               = "fra"
  image              = local.image
  load_balancer_ip   = local.pops.fra.address
  global_gossip_join = local.global_gossip_join
  network_policy = {
    remote_pod_cidrs     = local.remote_pod_cidrs["eu-central"]
    monitoring_namespace = "monitoring"
  }

  # Phone calls (docs/sip.md, "Deploy"): carriers send SIP to
  # sip-fra.example.com (203.0.113.11) and RTP to this POP's VIP. The TLS
  # certificate is a kubernetes.io/tls Secret kept by cert-manager; the
  # trunk's digest password is CARRIER_A_SIP_PASSWORD of the POP's Secret.
  sip = {
    catalogue_yaml    = local.catalogue_yaml
    load_balancer_ip  = "203.0.113.11"
    contact_host      = "sip-fra.example.com"
    tls_secret_name   = "sip-fra-example-com"
    session_api_cidrs = [for r, c in local.regions : c.pod_cidr if r != "eu-central"]
    trunks = [{
      name                = "carrier-a"
      source_cidrs        = ["192.0.2.0/24"]
      digest_user         = "rtcedge"
      digest_password_key = "CARRIER_A_SIP_PASSWORD"
      max_calls           = 200
      calls_per_second    = 20
      session             = { instructions = "You answer the booking line.", voice = "alloy" }
    }]
  }
}

module "pop_iad" {
  source    = "../../modules/pop"
  providers = { kubernetes = kubernetes.us_east }

  region             = local.pops.iad.region
  pop_id             = local.pops.iad.id
  name               = "iad"
  image              = local.image
  load_balancer_ip   = local.pops.iad.address
  global_gossip_join = local.global_gossip_join
  network_policy = {
    remote_pod_cidrs     = local.remote_pod_cidrs["us-east"]
    monitoring_namespace = "monitoring"
  }
}

module "steering" {
  source = "../../modules/cloudflare-steering"

  account_id      = var.cloudflare_account_id
  zone_id         = var.cloudflare_zone_id
  hostname        = local.hostname
  steering_policy = "geo"
  fallback_region = "eu-central"
  region_order    = ["eu-central", "us-east"]

  regions = {
    for name, r in local.regions : name => {
      origins            = r.origins
      latitude           = r.location.lat
      longitude          = r.location.lon
      cloudflare_regions = r.cloudflare_regions
    }
  }
  country_overrides = local.steering_countries

  # The reserved addresses, known at plan time (the cloud's status address
  # is not, and is a hostname on some clouds).
  relay_records = {
    for pop, p in local.pops : pop => { name = "${pop}.relay.example.com", address = p.address }
  }
}
