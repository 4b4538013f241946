# Inputs of the Cloudflare steering module: one load balancer on the signaling
# hostname, one pool per region, a shared readiness monitor, and DNS records
# for the global relay VIPs.

variable "account_id" {
  description = "Cloudflare account ID (monitors and pools are account-level objects)."
  type        = string
}

variable "zone_id" {
  description = "Cloudflare zone ID holding the signaling hostname and the relay records."
  type        = string
}

variable "hostname" {
  description = "Signaling hostname the load balancer answers for, e.g. rt.example.com."
  type        = string
}

variable "name_prefix" {
  description = "Prefix of pool names; pools are named <prefix>-<region>."
  type        = string
  default     = "rtcedge"
}

variable "regions" {
  description = <<-EOT
    Regions by catalogue name (geo/testdata/catalogue.yaml). origins are the
    addresses (IPs or hostnames) of the region's public signaling endpoints;
    latitude/longitude place the pool for proximity steering (use the
    catalogue's region location); cloudflare_regions are Cloudflare region
    codes (WNAM, ENAM, WEU, EEU, NSAM, SSAM, OC, ME, NAF, SAF, SAS, SEAS,
    NEAS: the API's enumeration) and countries ISO 3166-1 alpha-2 codes that
    geo steering sends to this region first.
  EOT
  type = map(object({
    origins            = list(string)
    latitude           = number
    longitude          = number
    cloudflare_regions = optional(list(string), [])
    countries          = optional(list(string), [])
  }))

  validation {
    condition     = length(var.regions) > 0 && alltrue([for r in values(var.regions) : length(r.origins) > 0])
    error_message = "Give at least one region, each with at least one origin."
  }
  validation {
    condition = alltrue(flatten([for r in values(var.regions) : [
      for code in r.cloudflare_regions : contains(["WNAM", "ENAM", "WEU", "EEU", "NSAM", "SSAM", "OC", "ME", "NAF", "SAF", "SAS", "SEAS", "NEAS"], code)
    ]]))
    error_message = "cloudflare_regions must be Cloudflare region codes: WNAM, ENAM, WEU, EEU, NSAM, SSAM, OC, ME, NAF, SAF, SAS, SEAS, NEAS (South America is NSAM and SSAM; there is no SAM)."
  }
  validation {
    condition     = alltrue(flatten([for r in values(var.regions) : [for cc in r.countries : can(regex("^[A-Za-z]{2}$", cc))]]))
    error_message = "countries must be ISO 3166-1 alpha-2 codes."
  }
}

variable "check_regions" {
  description = "Cloudflare regions the monitor probes the pools from; null = every code the regions claim. Never null in the API: that probes from every data centre, which only Enterprise plans allow."
  type        = list(string)
  default     = null

  validation {
    condition = var.check_regions == null ? true : length(var.check_regions) > 0 && alltrue([
      for code in var.check_regions : contains(["WNAM", "ENAM", "WEU", "EEU", "NSAM", "SSAM", "OC", "ME", "NAF", "SAF", "SAS", "SEAS", "NEAS"], code)
    ])
    error_message = "check_regions must list Cloudflare region codes: WNAM, ENAM, WEU, EEU, NSAM, SSAM, OC, ME, NAF, SAF, SAS, SEAS, NEAS."
  }
}

variable "country_overrides" {
  description = "The catalogue's steering.countries (geo/README.md): country -> regions in order of preference. Each becomes a country pool (the preferred regions' pools, then the rest in failover order), so Cloudflare sends the country to the front signaling itself would choose. Continent entries must be listed here as their countries."
  type        = map(list(string))
  default     = {}

  validation {
    condition     = alltrue([for cc, regions in var.country_overrides : can(regex("^[A-Z]{2}$", cc)) && length(regions) > 0])
    error_message = "country_overrides keys are upper-case ISO 3166-1 alpha-2 codes, each with at least one region."
  }
}

variable "visitor_location_headers" {
  description = "Enable the zone's \"Add visitor location headers\" managed transform (CF-IPLatitude, CF-IPLongitude, CF-IPCity, ...), which signaling locates clients by. It is a zone-wide setting: set false when the zone's managed transforms are managed elsewhere, and enable it there."
  type        = bool
  default     = true
}

variable "region_order" {
  description = "Failover order of the regions (default_pools); regions not listed follow in name order."
  type        = list(string)
  default     = []
}

variable "fallback_region" {
  description = "Region whose pool takes the traffic when every pool is unhealthy."
  type        = string
}

variable "steering_policy" {
  description = "\"geo\": region_pools/country_pools from cloudflare_regions/countries; \"proximity\": nearest pool by the resolver's or client's location against pool latitude/longitude."
  type        = string
  default     = "geo"

  validation {
    condition     = contains(["geo", "proximity"], var.steering_policy)
    error_message = "steering_policy must be \"geo\" or \"proximity\"."
  }
}

variable "proxied" {
  description = "Proxy the signaling hostname through Cloudflare (orange cloud). Signaling then trusts CF-* headers from Cloudflare's ranges."
  type        = bool
  default     = true
}

variable "ttl" {
  description = "DNS TTL in seconds of the load balancer's answer when not proxied."
  type        = number
  default     = 30
}

variable "monitor_path" {
  description = "Health check path; every role answers /readyz with 200, 503 while draining."
  type        = string
  default     = "/readyz"
}

variable "monitor_expected_codes" {
  description = "Expected HTTP status of the health check."
  type        = string
  default     = "200"
}

variable "monitor_port" {
  description = "Port the monitor probes; null = the scheme's default (443 for https)."
  type        = number
  default     = null
}

variable "monitor_interval" {
  description = "Seconds between health checks (plan-dependent minimum)."
  type        = number
  default     = 60
}

variable "monitor_timeout" {
  description = "Seconds before a health check counts as failed."
  type        = number
  default     = 5
}

variable "monitor_retries" {
  description = "Immediate retries after a timeout before an origin is marked unhealthy."
  type        = number
  default     = 2
}

variable "relay_records" {
  description = "DNS records for the global relay POP VIPs, by POP name: name (FQDN or zone-relative) and address (IPv4 gives A, IPv6 gives AAAA). Never proxied: media is UDP straight to the VIP. Pass the reserved address (known at plan time, the one the catalogue lists), not the cloud load balancer's status, which is unknown until apply and on some clouds a hostname."
  type = map(object({
    name    = string
    address = string
  }))
  default = {}

  validation {
    condition     = alltrue([for r in values(var.relay_records) : can(cidrhost("${r.address}/32", 0)) || can(cidrhost("${r.address}/128", 0))])
    error_message = "relay_records addresses must be IP addresses (the POPs' reserved VIPs), not hostnames."
  }
}

variable "relay_ttl" {
  description = "TTL in seconds of the relay records."
  type        = number
  default     = 300
}
