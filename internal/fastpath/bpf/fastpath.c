/* The relays' in-kernel fast path (docs/fastpath.md): two TC programs that
 * forward the established flows user space has installed, and pass every
 * other datagram up to user space unchanged, counted by reason.
 *
 *   global_relay   on a global relay's interface: a client's DTLS or
 *                  RTP/RTCP datagram to the VIP gets header v2 pushed and
 *                  sealed (SipHash-2-4) and goes to the flow's cluster
 *                  relay from the worker's ingress socket; a cluster
 *                  relay's reply to an ingress socket is verified, its
 *                  header popped, and it goes to the client from the VIP.
 *   cluster_relay  on a cluster relay's interface: a header whose tag
 *                  verifies goes to the pod its pod ID names, or back to
 *                  the global relay ingress it names.
 *
 * One decision per packet; every check comes before the first write, so a
 * datagram passed up is the datagram that arrived. Only IPv4 without
 * options or fragments, and headers with IPv4 addresses, are handled here:
 * the rest is user space's, as is every decision that needs a secret the
 * kernel does not hold (routing tokens, STUN, new flows, bundles, probes).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "fastpath.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

#define ETH_LEN 14
#define IP_OFF ETH_LEN
#define UDP_OFF (ETH_LEN + sizeof(struct iphdr))
#define CSUM_OFF (UDP_OFF + offsetof(struct udphdr, check))
#define PAYLOAD_OFF (UDP_OFF + sizeof(struct udphdr))
#define AF_INET 2
#define MAX_FLOWS 65536
#define MAX_KEYS 8192

/* TCX verdicts: pass on to the next program and then the stack. */
#define PASS_UP TC_ACT_UNSPEC

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FLOWS);
	__type(key, struct gr_flow_key);
	__type(value, struct gr_flow);
} gr_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct fp_addr4);
	__type(value, struct gr_worker);
} gr_workers SEC(".maps");

/* Cluster relays a global relay takes replies from, and their cluster. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct fp_addr4);
	__type(value, __u32);
} gr_relays SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_KEYS);
	__type(key, struct fp_key_id);
	__type(value, struct fp_key);
} hop_keys SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cr_config);
} cr_conf SEC(".maps");

/* Pod ID → data address, and back. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct fp_addr4);
} cr_pods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct fp_addr4);
	__type(value, __u32);
} cr_pod_at SEC(".maps");

/* Global relay ingress sockets that have sent authenticated datagrams
 * toward pods: the only addresses replies go to. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct fp_addr4);
	__type(value, __u32);
} cr_ingresses SEC(".maps");

/* Room to sum a datagram's bytes in (udp_csum_ok), per CPU. */
#define CSUM_CHUNK 512
struct scratch {
	__u8 b[CSUM_CHUNK + 4];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} fp_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FP_NREASONS);
	__type(key, __u32);
	__type(value, struct fp_count);
} fp_stats SEC(".maps");

static __always_inline int count(struct __sk_buff *skb, __u32 reason)
{
	struct fp_count *c = bpf_map_lookup_elem(&fp_stats, &reason);
	if (c) {
		c->packets++;
		c->bytes += skb->len;
	}
	return reason;
}

static __always_inline int pass(struct __sk_buff *skb, __u32 reason)
{
	count(skb, reason);
	return PASS_UP;
}

/* SipHash-2-4 (internal/encap/siphash.go) of the 30 bytes m: a header v2
 * with IPv4 addresses up to its tag, then the payload length. */
#define ROTL(x, b) (__u64)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                               \
	do {                                                                   \
		v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);      \
		v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                         \
		v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                         \
		v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);      \
	} while (0)
#define SIPBLOCK(w)                                                            \
	do {                                                                   \
		v3 ^= (w); SIPROUND; SIPROUND; v0 ^= (w);                      \
	} while (0)

static __always_inline __u64 le64(const __u8 *p)
{
	__u64 w;
	__builtin_memcpy(&w, p, 8); /* bpfel: a little-endian load */
	return w;
}

static __always_inline __u64 siphash30(const struct fp_key *k, const __u8 m[32])
{
	__u64 v0 = k->k0 ^ 0x736f6d6570736575ULL;
	__u64 v1 = k->k1 ^ 0x646f72616e646f6dULL;
	__u64 v2 = k->k0 ^ 0x6c7967656e657261ULL;
	__u64 v3 = k->k1 ^ 0x7465646279746573ULL;
	__u64 last;

	SIPBLOCK(le64(m));
	SIPBLOCK(le64(m + 8));
	SIPBLOCK(le64(m + 16));
	/* Bytes 24..29, and the length (30) in the top byte. */
	last = le64(m + 24) & 0x0000ffffffffffffULL;
	last |= (__u64)30 << 56;
	SIPBLOCK(last);
	v2 ^= 0xff;
	SIPROUND; SIPROUND; SIPROUND; SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

/* tag computes the tag of the header in h (the first 28 bytes) over a
 * payload of n bytes, big-endian as it is written. */
static __always_inline __u64 tag(const struct fp_key *k, const __u8 h[ENCAP_LEN], __u16 n)
{
	__u8 m[32] = {};

	__builtin_memcpy(m, h, ENCAP_SIGNED);
	m[28] = n >> 8;
	m[29] = n;
	return __builtin_bswap64(siphash30(k, m)); /* its bytes big-endian, as written */
}

/* A packet's IPv4 and UDP headers, read and checked once. */
struct l4 {
	struct iphdr ip;
	struct udphdr udp;
	__u32 n; /* UDP payload length */
};

/* parse reads the IPv4/UDP headers; a non-zero result is the reason to
 * pass the packet up. */
static __always_inline int parse(struct __sk_buff *skb, struct l4 *p)
{
	__u32 tot;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return FP_PASS_NOT_IPV4;
	if (bpf_skb_load_bytes(skb, IP_OFF, &p->ip, sizeof(p->ip)))
		return FP_PASS_SHORT;
	if (p->ip.version != 4)
		return FP_PASS_NOT_IPV4;
	if (p->ip.ihl != 5)
		return FP_PASS_IP_OPTIONS;
	if (p->ip.frag_off & bpf_htons(0x3fff))
		return FP_PASS_FRAGMENT;
	if (p->ip.protocol != IPPROTO_UDP)
		return FP_PASS_NOT_UDP;
	tot = bpf_ntohs(p->ip.tot_len);
	/* The whole frame must be the IP packet: no trailer to carry along. */
	if (tot < sizeof(struct iphdr) + sizeof(struct udphdr) || ETH_LEN + tot != skb->len)
		return FP_PASS_SHORT;
	if (bpf_skb_load_bytes(skb, UDP_OFF, &p->udp, sizeof(p->udp)))
		return FP_PASS_SHORT;
	if (bpf_ntohs(p->udp.len) != tot - sizeof(struct iphdr))
		return FP_PASS_SHORT;
	p->n = tot - sizeof(struct iphdr) - sizeof(struct udphdr);
	return 0;
}

/* udp_csum_ok verifies the UDP checksum of the datagram in full (0: none
 * sent). The program changes checksums incrementally, which keeps a
 * corrupted datagram corrupted, as the stack would have dropped it; and a
 * datagram whose checksum is still to be computed (CHECKSUM_PARTIAL, from
 * a socket on this host) fails here and goes up, as the programs cannot
 * move the skb's checksum start when they change its length. */
static __always_inline int udp_csum_ok(struct __sk_buff *skb, const struct l4 *p)
{
	__u64 len = p->n + sizeof(struct udphdr), off = 0, chunk, words;
	__u32 zero = 0;
	__be32 pseudo[3];
	struct scratch *s;
	__s64 sum;
	int i;

	if (p->udp.check == 0)
		return 1;
	s = bpf_map_lookup_elem(&fp_scratch, &zero);
	if (!s)
		return 0;
	pseudo[0] = p->ip.saddr;
	pseudo[1] = p->ip.daddr;
	pseudo[2] = bpf_htonl(IPPROTO_UDP << 16 | (__u32)len);
	sum = bpf_csum_diff(0, 0, pseudo, sizeof(pseudo), 0);
	for (i = 0; i < 4; i++) {
		if (off >= len)
			break;
		chunk = len - off;
		if (chunk >= CSUM_CHUNK) {
			if (bpf_skb_load_bytes(skb, UDP_OFF + off, s->b, CSUM_CHUNK))
				return 0;
			sum = bpf_csum_diff(0, 0, (__be32 *)s->b, CSUM_CHUNK, sum);
			if (sum < 0)
				return 0;
			off += CSUM_CHUNK;
			continue;
		}
		/* The tail: its length checked where the verifier sees it. */
		asm volatile("" : "+r"(chunk));
		if (chunk < 1 || chunk > CSUM_CHUNK - 1)
			return 0;
		if (bpf_skb_load_bytes(skb, UDP_OFF + off, s->b, chunk))
			return 0;
		/* bpf_csum_diff sums whole words: zero what pads the last. */
		s->b[chunk] = 0;
		s->b[chunk + 1] = 0;
		s->b[chunk + 2] = 0;
		words = (chunk + 3) & ~3ULL;
		asm volatile("" : "+r"(words));
		if (words < 4 || words > CSUM_CHUNK)
			return 0;
		sum = bpf_csum_diff(0, 0, (__be32 *)s->b, words, sum);
		if (sum < 0)
			return 0;
		off += chunk;
	}
	if (off < len)
		return 0;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return sum == 0xffff;
}

/* A decoded header v2 with IPv4 addresses. */
struct hdr {
	__u8 b[ENCAP_LEN];
	__u8 flags;
	__u8 key_id;
	__u16 cluster, pod, pop;
	struct fp_addr4 client, ingress;
};

/* decode reads the header at the start of the payload the way encap.Decode
 * does; a non-zero result is the reason to pass the packet up. */
static __always_inline int decode(struct __sk_buff *skb, __u32 n, struct hdr *h)
{
	__u8 b0;

	if (n > ENCAP_MAX_DATAGRAM)
		return FP_PASS_OVERSIZE;
	if (n == 0 || bpf_skb_load_bytes(skb, PAYLOAD_OFF, &b0, 1))
		return FP_PASS_HEADER;
	if (b0 == PROBE_MAGIC)
		return FP_PASS_PROBE;
	if (b0 == BUNDLE_MAGIC)
		return FP_PASS_BUNDLE;
	if (n < ENCAP_LEN || bpf_skb_load_bytes(skb, PAYLOAD_OFF, h->b, ENCAP_LEN))
		return FP_PASS_HEADER;
	h->flags = h->b[1] & 0x0f;
	if (h->b[0] != ENCAP_MAGIC || h->b[1] >> 4 != ENCAP_VERSION || h->b[3] != 0 ||
	    (h->flags & (FLAG_CLIENT_V6 | FLAG_INGRESS_V6)))
		return FP_PASS_HEADER;
	h->key_id = h->b[2];
	h->cluster = (__u16)h->b[4] << 8 | h->b[5];
	h->pod = (__u16)h->b[6] << 8 | h->b[7];
	h->pop = (__u16)h->b[8] << 8 | h->b[9];
	__builtin_memcpy(&h->client.port, &h->b[16], 2);
	__builtin_memcpy(&h->client.ip, &h->b[18], 4);
	__builtin_memcpy(&h->ingress.port, &h->b[22], 2);
	__builtin_memcpy(&h->ingress.ip, &h->b[24], 4);
	h->client.pad = 0;
	h->ingress.pad = 0;
	return 0;
}

/* verify checks the header's tag under the key of its cluster, pod and key
 * ID (a per-pod key, else the cluster's static key of that ID). */
static __always_inline int verify(const struct hdr *h, __u32 n)
{
	struct fp_key_id id = {.cluster = h->cluster, .pod = h->pod, .key_id = h->key_id};
	struct fp_key *k;
	__u64 want;

	if (h->key_id > 15)
		return FP_PASS_KEY;
	k = bpf_map_lookup_elem(&hop_keys, &id);
	if (!k) {
		id.pod = 0;
		id.any_pod = 1;
		k = bpf_map_lookup_elem(&hop_keys, &id);
	}
	if (!k)
		return FP_PASS_KEY;
	__builtin_memcpy(&want, &h->b[ENCAP_SIGNED], 8);
	if (tag(k, h->b, n - ENCAP_LEN) != want)
		return FP_PASS_TAG;
	return 0;
}

/* route finds how to reach dst from src: the egress device and the
 * Ethernet addresses, looked up from the sender's side on the device the
 * packet came in on (a relay with one interface; another route passes the
 * packet up). */
struct next_hop {
	struct bpf_fib_lookup fib;
	int neigh; /* the neighbour is unknown: bpf_redirect_neigh resolves it */
};

static __always_inline int route(struct __sk_buff *skb, __be32 src, __be32 dst, struct next_hop *nh)
{
	struct bpf_fib_lookup *fib = &nh->fib;

	long rc;

	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET;
	fib->l4_protocol = IPPROTO_UDP;
	/* tot_len 0: the MTU is checked apart, with bpf_check_mtu (fits). */
	fib->ipv4_src = src;
	fib->ipv4_dst = dst;
	fib->ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
	nh->neigh = 0;
	rc = bpf_fib_lookup(skb, fib, sizeof(*fib), BPF_FIB_LOOKUP_OUTPUT);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS)
		return 0;
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		nh->neigh = 1;
		return 0;
	}
	return FP_PASS_FIB;
}

/* fits checks that the packet grown by grow bytes fits the egress MTU. */
static __always_inline int fits(struct __sk_buff *skb, __u32 ifindex, __s32 grow)
{
	__u32 mtu = 0;

	if (bpf_check_mtu(skb, ifindex, &mtu, grow, 0) != BPF_MTU_CHK_RET_SUCCESS)
		return FP_PASS_MTU;
	return 0;
}

/* send writes the new addresses, ports and lengths of a packet whose
 * payload has already been rewritten, fixes the checksums (addend is the
 * checksum of the payload bytes added, or of those removed negated) and
 * redirects it. old holds the headers as they arrived. */
static __always_inline int send(struct __sk_buff *skb, const struct l4 *old, struct fp_addr4 src,
				struct fp_addr4 dst, __u16 udplen, __s64 addend,
				struct next_hop *nh, __u32 reason)
{
	struct iphdr ip = old->ip;
	struct udphdr udp = old->udp;
	__be16 len = bpf_htons(udplen);
	__u32 csum;
	__u64 flags = BPF_F_MARK_MANGLED_0;

	udp.source = src.port;
	udp.dest = dst.port;
	udp.len = len;
	if (bpf_skb_store_bytes(skb, UDP_OFF, &udp, sizeof(udp), 0))
		return TC_ACT_SHOT;
	/* The UDP checksum, incrementally: pseudo-header fields, then the
	 * header's own, then the payload bytes added or removed. */
	bpf_l4_csum_replace(skb, CSUM_OFF, old->ip.saddr, src.ip, flags | BPF_F_PSEUDO_HDR | 4);
	bpf_l4_csum_replace(skb, CSUM_OFF, old->ip.daddr, dst.ip, flags | BPF_F_PSEUDO_HDR | 4);
	bpf_l4_csum_replace(skb, CSUM_OFF, old->udp.len, len, flags | BPF_F_PSEUDO_HDR | 2);
	bpf_l4_csum_replace(skb, CSUM_OFF, old->udp.len, len, flags | 2);
	bpf_l4_csum_replace(skb, CSUM_OFF, old->udp.source, src.port, flags | 2);
	bpf_l4_csum_replace(skb, CSUM_OFF, old->udp.dest, dst.port, flags | 2);
	if (addend)
		bpf_l4_csum_replace(skb, CSUM_OFF, 0, addend, flags);

	ip.saddr = src.ip;
	ip.daddr = dst.ip;
	ip.tot_len = bpf_htons(udplen + sizeof(struct iphdr));
	ip.ttl = 64;
	ip.check = 0;
	csum = bpf_csum_diff(0, 0, (__be32 *)&ip, sizeof(ip), 0);
	csum = (csum & 0xffff) + (csum >> 16);
	csum = (csum & 0xffff) + (csum >> 16);
	ip.check = ~csum;
	if (bpf_skb_store_bytes(skb, IP_OFF, &ip, sizeof(ip), 0))
		return TC_ACT_SHOT;
	count(skb, reason);
	if (nh->neigh)
		return bpf_redirect_neigh(nh->fib.ifindex, 0, 0, 0);
	if (bpf_skb_store_bytes(skb, 0, nh->fib.dmac, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, nh->fib.smac, ETH_ALEN, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(nh->fib.ifindex, 0);
}

/* rtp_ssrc reads the SSRC of an RTP datagram as the relay notes it
 * (globalrelay's rtpSSRC): none for RTCP or short ones. */
static __always_inline int rtp_ssrc(struct __sk_buff *skb, __u32 n, __u32 *ssrc)
{
	__u8 b[12];

	if (n < 12 || bpf_skb_load_bytes(skb, PAYLOAD_OFF, b, 12))
		return 0;
	if ((b[1] & 0x7f) >= 64 && (b[1] & 0x7f) < 96)
		return 0;
	*ssrc = (__u32)b[8] << 24 | (__u32)b[9] << 16 | (__u32)b[10] << 8 | b[11];
	return 1;
}

/* client_to_cluster forwards a client's datagram of an installed flow. */
static __always_inline int client_to_cluster(struct __sk_buff *skb, struct l4 *p)
{
	struct gr_flow_key key = {.client_ip = p->ip.saddr, .vip_ip = p->ip.daddr,
				  .client_port = p->udp.source, .vip_port = p->udp.dest};
	struct next_hop nh;
	struct fp_addr4 ingress = {};
	struct gr_flow *f;
	__u8 h[ENCAP_LEN];
	__u64 t, now;
	__u32 ssrc;
	__s64 added;
	__u8 b0;
	int r;

	f = bpf_map_lookup_elem(&gr_flows, &key);
	if (!f)
		return pass(skb, FP_PASS_MISS);
	if (p->n == 0)
		return pass(skb, FP_PASS_EMPTY);
	if (p->n > ENCAP_MAX_PAYLOAD)
		return pass(skb, FP_PASS_OVERSIZE);
	if (bpf_skb_load_bytes(skb, PAYLOAD_OFF, &b0, 1))
		return pass(skb, FP_PASS_SHORT);
	if (b0 <= 3)
		return pass(skb, FP_PASS_STUN);
	if (!((b0 >= 20 && b0 <= 63) || (b0 >= 128 && b0 <= 191)))
		return pass(skb, FP_PASS_CLASS);
	now = bpf_ktime_get_ns();
	if (now >= f->refresh_ns)
		return pass(skb, FP_PASS_REFRESH);
	if (b0 >= 128 && rtp_ssrc(skb, p->n, &ssrc) && (!f->has_ssrc || f->ssrc != ssrc))
		return pass(skb, FP_PASS_SSRC);
	if (!udp_csum_ok(skb, p))
		return pass(skb, FP_PASS_CSUM);

	__builtin_memcpy(h, f->hdr, ENCAP_SIGNED);
	__builtin_memcpy(&ingress.port, &h[22], 2);
	__builtin_memcpy(&ingress.ip, &h[24], 4);
	r = route(skb, ingress.ip, f->relay.ip, &nh);
	if (!r)
		r = fits(skb, nh.fib.ifindex, ENCAP_LEN);
	if (r)
		return pass(skb, r);
	t = tag(&f->seal, h, p->n);
	__builtin_memcpy(&h[ENCAP_SIGNED], &t, 8);

	if (bpf_skb_adjust_room(skb, ENCAP_LEN, BPF_ADJ_ROOM_NET, 0))
		return pass(skb, FP_PASS_ADJUST);
	/* [eth][ip][36 new][udp][payload]: the UDP header moves to the front
	 * of the room (send), the header fills the rest and the old UDP
	 * header's place. */
	if (bpf_skb_store_bytes(skb, PAYLOAD_OFF, h, ENCAP_LEN, 0))
		return TC_ACT_SHOT;
	added = bpf_csum_diff(0, 0, (__be32 *)h, ENCAP_LEN, 0);

	f->last_seen_ns = now;
	__sync_fetch_and_add(&f->up_packets, 1);
	__sync_fetch_and_add(&f->up_bytes, p->n);
	return send(skb, p, ingress, f->relay, p->n + ENCAP_LEN + sizeof(struct udphdr), added, &nh,
		    FP_FORWARD_UP);
}

/* cluster_to_client forwards a cluster relay's reply to a worker's ingress
 * socket: verified, for an installed flow, from a relay of its cluster. */
static __always_inline int cluster_to_client(struct __sk_buff *skb, struct l4 *p,
					     const struct gr_worker *w)
{
	struct fp_addr4 from = {.ip = p->ip.saddr, .port = p->udp.source};
	struct next_hop nh;
	struct gr_flow_key key;
	struct gr_flow *f;
	struct hdr h;
	__u32 *cl;
	__s64 removed;
	__u16 fc, fp;
	int r;

	r = decode(skb, p->n, &h);
	if (!r)
		r = verify(&h, p->n);
	if (r)
		return pass(skb, r);
	if (!(h.flags & FLAG_TO_CLIENT))
		return pass(skb, FP_PASS_DIRECTION);
	if (h.pop != w->pop)
		return pass(skb, FP_PASS_POP);
	if (p->n == ENCAP_LEN)
		return pass(skb, FP_PASS_EMPTY);
	cl = bpf_map_lookup_elem(&gr_relays, &from);
	if (!cl || *cl != h.cluster)
		return pass(skb, FP_PASS_NOT_FROM_CLUSTER);
	if (h.flags & FLAG_TCP)
		return pass(skb, FP_PASS_TCP);
	key.client_ip = h.client.ip;
	key.client_port = h.client.port;
	key.vip_ip = w->vip.ip;
	key.vip_port = w->vip.port;
	f = bpf_map_lookup_elem(&gr_flows, &key);
	if (!f)
		return pass(skb, FP_PASS_MISS);
	if (!udp_csum_ok(skb, p))
		return pass(skb, FP_PASS_CSUM);
	fc = (__u16)f->hdr[4] << 8 | f->hdr[5];
	fp = (__u16)f->hdr[6] << 8 | f->hdr[7];
	if (fc != h.cluster || fp != h.pod)
		return pass(skb, FP_PASS_FLOW_MISMATCH);
	r = route(skb, w->vip.ip, h.client.ip, &nh);
	if (r)
		return pass(skb, r);

	removed = bpf_csum_diff((__be32 *)h.b, ENCAP_LEN, 0, 0, 0);
	if (bpf_skb_adjust_room(skb, -ENCAP_LEN, BPF_ADJ_ROOM_NET, 0))
		return pass(skb, FP_PASS_ADJUST);
	f->last_reply_ns = bpf_ktime_get_ns();
	f->reply_relay = from;
	__sync_fetch_and_add(&f->down_packets, 1);
	__sync_fetch_and_add(&f->down_bytes, p->n - ENCAP_LEN);
	return send(skb, p, w->vip, h.client, p->n - ENCAP_LEN + sizeof(struct udphdr), removed, &nh,
		    FP_FORWARD_DOWN);
}

SEC("tcx/ingress")
int global_relay(struct __sk_buff *skb)
{
	struct fp_addr4 dst = {};
	struct gr_worker *w;
	struct l4 p;
	int r;

	r = parse(skb, &p);
	if (r)
		return pass(skb, r);
	dst.ip = p.ip.daddr;
	dst.port = p.udp.dest;
	w = bpf_map_lookup_elem(&gr_workers, &dst);
	if (w)
		return cluster_to_client(skb, &p, w);
	return client_to_cluster(skb, &p);
}

SEC("tcx/ingress")
int cluster_relay(struct __sk_buff *skb)
{
	struct fp_addr4 from = {}, to = {}, *podaddr;
	struct next_hop nh;
	struct cr_config *cfg;
	__u32 zero = 0, pod, *at;
	struct hdr h;
	struct l4 p;
	int r;

	r = parse(skb, &p);
	if (r)
		return pass(skb, r);
	cfg = bpf_map_lookup_elem(&cr_conf, &zero);
	if (!cfg || cfg->addr.ip != p.ip.daddr || cfg->addr.port != p.udp.dest)
		return pass(skb, FP_PASS_NOT_OURS);
	r = decode(skb, p.n, &h);
	if (r)
		return pass(skb, r);
	/* The cluster before the tag, as user space does. */
	if (h.cluster != cfg->cluster)
		return pass(skb, FP_PASS_WRONG_CLUSTER);
	r = verify(&h, p.n);
	if (r)
		return pass(skb, r);
	if (p.n == ENCAP_LEN)
		return pass(skb, FP_PASS_EMPTY);
	from.ip = p.ip.saddr;
	from.port = p.udp.source;
	if (h.flags & FLAG_TO_CLIENT) {
		at = bpf_map_lookup_elem(&cr_pod_at, &from);
		if (!at)
			return pass(skb, FP_PASS_NOT_FROM_POD);
		if (*at != h.pod)
			return pass(skb, FP_PASS_POD_MISMATCH);
		if (!bpf_map_lookup_elem(&cr_ingresses, &h.ingress))
			return pass(skb, FP_PASS_UNKNOWN_INGRESS);
		to = h.ingress;
		r = FP_FORWARD_CLIENT;
	} else {
		if (h.ingress.ip != from.ip || h.ingress.port != from.port)
			return pass(skb, FP_PASS_INGRESS);
		/* An ingress user space has not seen yet goes up, which
		 * records it. */
		if (!bpf_map_lookup_elem(&cr_ingresses, &from))
			return pass(skb, FP_PASS_UNKNOWN_INGRESS);
		pod = h.pod;
		podaddr = bpf_map_lookup_elem(&cr_pods, &pod);
		if (!podaddr)
			return pass(skb, FP_PASS_UNKNOWN_POD);
		to = *podaddr;
		r = FP_FORWARD_POD;
	}
	if (route(skb, cfg->addr.ip, to.ip, &nh))
		return pass(skb, FP_PASS_FIB);
	return send(skb, &p, cfg->addr, to, p.n + sizeof(struct udphdr), 0, &nh, r);
}
