# The POP's SIP front (docs/sip.md, "Deploy"), when var.sip is set: carriers
# point their trunks at this POP's SIP address, and the answers name this
# POP's VIP for the media, so SIP and RTP enter the network at one place.
#
# The front keeps each call's dialog in the replica that took its INVITE:
# the Service's session affinity ClientIP keeps every request of a carrier
# address on one replica, and externalTrafficPolicy Local keeps the
# carrier's source address, which trunks are recognised by.

locals {
  sip_enabled = var.sip != null
  sip_labels  = merge(local.labels, { "app.kubernetes.io/name" = "sipfront" })
  # TLS from the Secret this module manages, or one managed elsewhere.
  sip_tls_managed = nonsensitive(var.sip_tls != null)
  sip_tls_secret  = local.sip_tls_managed ? "rtcedge-sip-tls" : try(var.sip.tls_secret_name, null)
  sip_tls         = local.sip_tls_secret != null

  sip_session_api_keys = local.sip_enabled ? [for id in var.sip.session_api_clusters : "RTCEDGE_SESSION_API_SECRET_${id}"] : []
  sip_password_keys    = local.sip_enabled ? [for t in var.sip.trunks : t.digest_password_key if t.digest_password_key != null] : []
  sip_source_cidrs     = local.sip_enabled ? distinct(flatten([for t in var.sip.trunks : t.source_cidrs])) : []

  sip_config = !local.sip_enabled ? null : merge({
    log_level      = var.log_level
    metrics_addr   = "0.0.0.0:9090"
    drain_timeout  = "${var.sip.drain_timeout_seconds}s"
    sip_udp        = "0.0.0.0:5060"
    sip_tcp        = "0.0.0.0:5060"
    catalogue      = "/etc/rtcedge-catalogue/catalogue.yaml"
    geoip_db       = var.sip.geoip_claim_name == null ? "" : "/var/lib/geoip/GeoLite2-City.mmdb"
    contact_host   = var.sip.contact_host
    max_dialogs    = var.sip.max_dialogs
    source_rate    = var.sip.source_rate
    source_burst   = var.sip.source_burst
    invite_timeout = var.sip.invite_timeout
    trunks = [for t in var.sip.trunks : merge(
      {
        name             = t.name
        source_cidrs     = t.source_cidrs
        media_cidrs      = coalesce(t.media_cidrs, t.source_cidrs)
        max_calls        = t.max_calls
        calls_per_second = t.calls_per_second
        call_burst       = t.call_burst
        # This POP unless the trunk says otherwise: its answers then name
        # the VIP next to the SIP address the carrier uses.
        pop = t.pop == null ? var.name : t.pop
      },
      t.digest_user == null ? {} : { digest_user = t.digest_user, digest_password_env = t.digest_password_key },
      length(t.session) == 0 ? {} : { session = t.session },
    )]
    }, !local.sip_tls ? {} : {
    sip_tls  = "0.0.0.0:5061"
    tls_cert = "/etc/rtcedge-sip-tls/tls.crt"
    tls_key  = "/etc/rtcedge-sip-tls/tls.key"
  })

  # The file itself: session_api_secrets is keyed by cluster ID, a YAML
  # integer, and yamlencode writes every key as a string ("1"), which the
  # binary refuses; those lines are written out here.
  sip_config_yaml = !local.sip_enabled ? null : join("", concat(
    [yamlencode(local.sip_config)],
    length(var.sip.session_api_clusters) == 0 ? [] : ["session_api_secrets:\n"],
    [for id in var.sip.session_api_clusters : "  ${id}: \"$${RTCEDGE_SESSION_API_SECRET_${id}}\"\n"],
  ))

  # Read from the resources, so a roll starts once they hold the new values.
  sip_annotations = !local.sip_enabled ? {} : merge(
    { "rtcedge.example.com/catalogue-sha" = sha256(kubernetes_config_map_v1.sip_catalogue[0].data["catalogue.yaml"]) },
    !local.sip_tls_managed ? {} : {
      "rtcedge.example.com/sip-tls-sha" = nonsensitive(sha256(jsonencode(kubernetes_secret_v1.sip_tls[0].data)))
    },
  )
}

resource "kubernetes_config_map_v1" "sip_catalogue" {
  count = local.sip_enabled ? 1 : 0
  metadata {
    name      = "rtcedge-catalogue"
    namespace = local.namespace
    labels    = local.sip_labels
  }
  data = {
    "catalogue.yaml" = var.sip.catalogue_yaml
  }
}

resource "kubernetes_secret_v1" "sip_tls" {
  count = local.sip_enabled && local.sip_tls_managed ? 1 : 0
  metadata {
    name      = "rtcedge-sip-tls"
    namespace = local.namespace
    labels    = local.sip_labels
  }
  type = "kubernetes.io/tls"
  data = {
    "tls.crt" = var.sip_tls.certificate
    "tls.key" = var.sip_tls.private_key
  }
}

# The fronts: a replica per node preferred; a drain ends its calls (BYE)
# before the pod stops.
module "sipfront" {
  count                     = local.sip_enabled ? 1 : 0
  source                    = "../workload"
  name                      = "sipfront"
  namespace                 = local.namespace
  labels                    = local.sip_labels
  annotations               = local.sip_annotations
  image                     = var.image
  config                    = local.sip_config
  config_yaml               = local.sip_config_yaml
  replicas                  = try(var.sip.replicas, 2)
  start_before_stop         = true
  spread_over_nodes         = true
  termination_grace_seconds = try(var.sip.drain_timeout_seconds, 60) + 15
  secret_name               = var.secret_name
  secret_hashes             = local.secret_hashes
  secret_keys               = concat(local.sip_session_api_keys, local.sip_password_keys)
  resources                 = try(var.sip.resources, null)
  volumes = concat(
    [{ name = "catalogue", mount_path = "/etc/rtcedge-catalogue", config_map = "rtcedge-catalogue" }],
    local.sip_tls ? [{ name = "sip-tls", mount_path = "/etc/rtcedge-sip-tls", secret = local.sip_tls_secret }] : [],
    try(var.sip.geoip_claim_name, null) == null ? [] : [{ name = "geoip", mount_path = "/var/lib/geoip", claim = var.sip.geoip_claim_name }],
  )
  # 5061 is declared whether or not TLS listens: the Service only names it
  # with a certificate.
  ports = [
    { name = "sip-udp", port = 5060, protocol = "UDP" },
    { name = "sip-tcp", port = 5060, protocol = "TCP" },
    { name = "sips", port = 5061, protocol = "TCP" },
    { name = "metrics", port = 9090, protocol = "TCP" },
  ]
}

resource "kubernetes_service_v1" "sip" {
  count = local.sip_enabled ? 1 : 0
  metadata {
    name        = "rtcedge-sip"
    namespace   = local.namespace
    labels      = local.sip_labels
    annotations = var.sip.service_annotations
  }
  spec {
    type                    = "LoadBalancer"
    load_balancer_ip        = var.sip.load_balancer_ip
    external_traffic_policy = "Local"
    session_affinity        = "ClientIP"
    selector                = local.sip_labels
    port {
      name        = "sip-udp"
      port        = 5060
      target_port = "sip-udp"
      protocol    = "UDP"
    }
    port {
      name        = "sip-tcp"
      port        = 5060
      target_port = "sip-tcp"
      protocol    = "TCP"
    }
    dynamic "port" {
      for_each = local.sip_tls ? [1] : []
      content {
        name        = "sips"
        port        = 5061
        target_port = "sips"
        protocol    = "TCP"
      }
    }
  }
  wait_for_load_balancer = true
}
