/* The maps and records the fast path shares with user space
 * (internal/fastpath/maps.go mirrors every struct here; TestLayout checks
 * that the two agree). Addresses and ports are in network byte order as
 * they appear in packets; everything else is in host order. */
#ifndef RTCEDGE_FASTPATH_H
#define RTCEDGE_FASTPATH_H

#include <linux/types.h>

/* Header v2 with IPv4 client and ingress (docs/wire.md section 2). */
#define ENCAP_MAGIC 0x5E
#define ENCAP_VERSION 2
#define ENCAP_LEN 36     /* encap.MinLen */
#define ENCAP_SIGNED 28  /* the header without its tag */
#define ENCAP_MAX_PAYLOAD 1500
#define ENCAP_MAX_DATAGRAM (60 + ENCAP_MAX_PAYLOAD)
#define FLAG_TO_CLIENT 0x1
#define FLAG_CLIENT_V6 0x2
#define FLAG_INGRESS_V6 0x4
#define FLAG_TCP 0x8
#define PROBE_MAGIC 0x5C
#define BUNDLE_MAGIC 0x5D

/* An IPv4 socket address. */
struct fp_addr4 {
	__be32 ip;
	__be16 port;
	__u16 pad;
};

/* A hop key (SipHash's two halves, read little-endian from the key bytes
 * as internal/encap does) by cluster, pod and key ID. A static key (one
 * for every pod) is stored with any_pod = 1 and pod = 0. */
struct fp_key_id {
	__u16 cluster;
	__u16 pod;
	__u8 key_id;
	__u8 any_pod;
	__u16 pad;
};

struct fp_key {
	__u64 k0;
	__u64 k1;
};

/* Global relay: a client's flow, by its address and the VIP it sends to. */
struct gr_flow_key {
	__be32 client_ip;
	__be32 vip_ip;
	__be16 client_port;
	__be16 vip_port;
};

/* What user space installs for a flow, and what the program counts. */
struct gr_flow {
	/* Written by user space (Install); the program only reads. */
	struct fp_key seal;     /* the key the header's key ID names */
	__u64 refresh_ns;       /* bpf_ktime_get_ns() after which datagrams go up */
	struct fp_addr4 relay;  /* the flow's cluster relay */
	__u32 ssrc;             /* the client's RTP SSRC user space noted */
	__u8 has_ssrc;
	__u8 pad[3];
	__u8 hdr[ENCAP_SIGNED]; /* header without tag, key ID in place */
	__u8 pad2[4];
	/* Written by the program. */
	__u64 last_seen_ns;     /* last datagram from the client it forwarded */
	__u64 last_reply_ns;    /* last reply it forwarded to the client */
	struct fp_addr4 reply_relay; /* the cluster relay that reply came from */
	__u64 up_packets;
	__u64 up_bytes;         /* client payload bytes, as the relay counts them */
	__u64 down_packets;
	__u64 down_bytes;
};

/* Global relay: one worker's internal socket (the ingress), the VIP its
 * replies leave from and the POP. */
struct gr_worker {
	struct fp_addr4 vip;
	__u16 pop;
	__u16 pad;
};

/* Cluster relay: its data address and cluster. */
struct cr_config {
	struct fp_addr4 addr;
	__u16 cluster;
	__u16 pad;
};

/* What the programs count, per CPU: one slot per verdict reason. */
struct fp_count {
	__u64 packets;
	__u64 bytes;
};

enum fp_reason {
	FP_FORWARD_UP = 0,    /* global relay: client → cluster relay */
	FP_FORWARD_DOWN,      /* global relay: cluster relay → client */
	FP_FORWARD_POD,       /* cluster relay: → pod */
	FP_FORWARD_CLIENT,    /* cluster relay: → global relay */
	FP_PASS_NOT_IPV4,     /* not IPv4 (IPv6 flows stay in user space) */
	FP_PASS_IP_OPTIONS,
	FP_PASS_FRAGMENT,
	FP_PASS_NOT_UDP,      /* TCP (ICE-TCP) and everything else */
	FP_PASS_NOT_OURS,     /* not to one of the relay's sockets */
	FP_PASS_SHORT,        /* truncated IP or UDP */
	FP_PASS_MISS,         /* no flow */
	FP_PASS_STUN,
	FP_PASS_CLASS,        /* neither DTLS nor RTP/RTCP */
	FP_PASS_SSRC,         /* an SSRC user space has not noted */
	FP_PASS_REFRESH,      /* user space asked to see the flow again */
	FP_PASS_EMPTY,
	FP_PASS_OVERSIZE,
	FP_PASS_MTU,          /* would not fit the egress MTU with the header */
	FP_PASS_PROBE,
	FP_PASS_BUNDLE,
	FP_PASS_HEADER,       /* not a header v2 the program reads (or IPv6 in it) */
	FP_PASS_KEY,          /* no key for the header's key ID */
	FP_PASS_TAG,          /* the tag does not verify */
	FP_PASS_DIRECTION,
	FP_PASS_POP,
	FP_PASS_NOT_FROM_CLUSTER,
	FP_PASS_TCP,          /* reply to an ICE-TCP client */
	FP_PASS_FLOW_MISMATCH,
	FP_PASS_WRONG_CLUSTER,
	FP_PASS_UNKNOWN_POD,
	FP_PASS_NOT_FROM_POD,
	FP_PASS_POD_MISMATCH,
	FP_PASS_INGRESS,      /* toward a pod, not from the ingress it names */
	FP_PASS_UNKNOWN_INGRESS,
	FP_PASS_FIB,          /* no route or neighbour to the next hop */
	FP_PASS_ADJUST,       /* the kernel would not make room for the header */
	FP_PASS_CSUM,         /* a UDP checksum that does not verify, or is still to be computed */
	FP_NREASONS
};

#endif
