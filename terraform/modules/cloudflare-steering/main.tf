# Cloudflare load balancing for the signaling hostname: a readiness monitor,
# one pool per region, a geo- or proximity-steered load balancer, and plain
# DNS records for the relay VIPs. Attribute names follow the Cloudflare
# Terraform provider v5 (attributes, not blocks, for nested objects).

locals {
  # The description marks objects as managed here, so `rtcedge cloudflare
  # sync` (which tags its own objects differently) never adopts them.
  managed_by = "rtcedge-managed:terraform"

  region_names = sort(keys(var.regions))
  # Failover order: the listed regions first, then the rest by name.
  region_order = concat(
    [for r in var.region_order : r if contains(local.region_names, r)],
    [for r in local.region_names : r if !contains(var.region_order, r)],
  )

  pool_ids = { for r, p in cloudflare_load_balancer_pool.region : r => p.id }

  # A region's own pool first, then the others in failover order, so a
  # steered client still lands somewhere when its region is unhealthy.
  failover_ids = {
    for r in local.region_names : r => concat(
      [local.pool_ids[r]],
      [for o in local.region_order : local.pool_ids[o] if o != r],
    )
  }

  # Cloudflare region code (or country) -> the regions that claim it. More
  # than one claimant is a configuration error, which one() below reports.
  cf_region_owner = {
    for pair in flatten([
      for r, v in var.regions : [for code in v.cloudflare_regions : { code = code, region = r }]
    ]) : pair.code => pair.region...
  }
  country_owner = {
    for pair in flatten([
      for r, v in var.regions : [for cc in v.countries : { code = upper(cc), region = r }]
    ]) : pair.code => pair.region...
  }

  # The catalogue's per-country preferences: the preferred regions that have
  # a pool, then the others in failover order.
  override_ids = {
    for cc, prefs in var.country_overrides : cc => concat(
      [for r in prefs : local.pool_ids[r] if contains(local.region_names, r)],
      [for r in local.region_order : local.pool_ids[r] if !contains(prefs, r)],
    )
  }

  # Probe from where the clients are: the claimed codes, unless given.
  check_regions = var.check_regions != null ? var.check_regions : sort(distinct(flatten([
    for v in values(var.regions) : v.cloudflare_regions
  ])))
}

resource "cloudflare_load_balancer_monitor" "signaling" {
  account_id     = var.account_id
  description    = "${local.managed_by} signaling readiness for ${var.hostname}"
  type           = "https"
  method         = "GET"
  path           = var.monitor_path
  expected_codes = var.monitor_expected_codes
  port           = var.monitor_port
  interval       = var.monitor_interval
  timeout        = var.monitor_timeout
  retries        = var.monitor_retries
  # The origins serve several names; the Host header selects the signaling
  # front and lets TLS verification succeed.
  header = {
    "Host" = [var.hostname]
  }
  follow_redirects = false
  allow_insecure   = false
}

resource "cloudflare_load_balancer_pool" "region" {
  for_each = var.regions

  account_id      = var.account_id
  name            = "${var.name_prefix}-${each.key}"
  description     = "${local.managed_by} signaling pool of region ${each.key}"
  enabled         = true
  minimum_origins = 1
  monitor         = cloudflare_load_balancer_monitor.signaling.id
  # Never null: null probes from every Cloudflare data centre, which only
  # Enterprise plans allow (and which floods the origins with probes).
  check_regions = local.check_regions
  # Used by proximity steering; harmless for geo steering.
  latitude  = each.value.latitude
  longitude = each.value.longitude

  origins = [
    for i, address in each.value.origins : {
      name    = "${each.key}-${i + 1}"
      address = address
      enabled = true
      weight  = 1
      header = {
        host = [var.hostname]
      }
    }
  ]
}

resource "cloudflare_load_balancer" "signaling" {
  zone_id         = var.zone_id
  name            = var.hostname
  description     = "${local.managed_by} signaling front steering"
  enabled         = true
  proxied         = var.proxied
  ttl             = var.proxied ? null : var.ttl
  steering_policy = var.steering_policy
  # Signaling is stateless: every request may go to any front.
  session_affinity = "none"

  default_pools = [for r in local.region_order : local.pool_ids[r]]
  fallback_pool = local.pool_ids[var.fallback_region]

  region_pools = var.steering_policy == "geo" ? {
    for code, owners in local.cf_region_owner : code => local.failover_ids[one(owners)]
  } : null
  country_pools = var.steering_policy == "geo" ? merge(
    { for code, owners in local.country_owner : code => local.failover_ids[one(owners)] },
    local.override_ids,
  ) : null

  lifecycle {
    precondition {
      condition     = contains(keys(var.regions), var.fallback_region)
      error_message = "fallback_region must name one of the regions."
    }
    precondition {
      condition     = length(local.check_regions) > 0
      error_message = "No region claims a Cloudflare region code, so set check_regions (the pools must not probe from every data centre)."
    }
    precondition {
      condition     = length(setintersection(keys(local.country_owner), keys(var.country_overrides))) == 0
      error_message = "A country is claimed both by a region's countries and by country_overrides; keep one."
    }
    precondition {
      condition     = alltrue(flatten([for prefs in values(var.country_overrides) : [for r in prefs : contains(local.region_names, r)]]))
      error_message = "country_overrides name a region that is not in regions."
    }
  }
}

# CF-IPLatitude/CF-IPLongitude (and CF-IPCity, CF-IPContinent, ...) reach
# the origins only with this managed transform on. The resource owns the
# zone's managed-transform settings: list here any other transform the zone
# needs.
resource "cloudflare_managed_transforms" "visitor_location" {
  count = var.visitor_location_headers ? 1 : 0

  zone_id = var.zone_id
  managed_request_headers = [{
    id      = "add_visitor_location_headers"
    enabled = true
  }]
  managed_response_headers = []
}

resource "cloudflare_dns_record" "relay" {
  for_each = var.relay_records

  zone_id = var.zone_id
  name    = each.value.name
  type    = strcontains(each.value.address, ":") ? "AAAA" : "A"
  content = each.value.address
  ttl     = var.relay_ttl
  # Media is UDP to the VIP itself; Cloudflare's proxy carries only HTTP(S).
  proxied = false
  comment = "${local.managed_by} global relay POP ${each.key}"
}
