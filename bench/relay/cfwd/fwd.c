/*
 * fwd: the minimal C UDP forwarder the relay benchmark compares rtcedge's
 * relays with (bench/relay, docs/benchmarks.md). It is what one user-space
 * hop costs at the least: one thread, recvmmsg/sendmmsg in batches, an
 * 8-byte header instead of a flow table. One thread per direction blocks in
 * recvmmsg (MSG_WAITFORONE: it returns what is queued once one datagram is
 * there), so a batch costs exactly one recvmmsg and one sendmmsg.
 *
 *   fwd <target-ip> <target-port> [batch [bind-ip]]
 *
 * It binds two IPv4 sockets on bind-ip (default 127.0.0.1) with kernel-chosen ports and prints
 * "front <port> back <port>" on stdout:
 *
 *   front: a datagram from a client gets the header
 *          [0xC0, 0, client port (2, big-endian), client IPv4 (4)]
 *          put in front of it (scatter-gather: no copy) and leaves from the
 *          back socket toward the target.
 *   back:  a datagram that starts with such a header leaves from the front
 *          socket toward the address in the header, without the header.
 *
 * Two of them chain: the second one's header goes in front of the first
 * one's, and the target reflects datagrams unchanged. The forwarder ends on
 * SIGTERM or when stdin reaches EOF (its parent died). Build:
 * gcc -O2 -pthread -o fwd fwd.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAXBATCH 256
#define BUFLEN 2048
#define HDRLEN 8
#define MAGIC 0xC0

static struct in_addr bind_ip; /* where both sockets bind */

static int open_socket(void) {
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0) {
		perror("socket");
		exit(1);
	}
	int sz = 4 << 20; /* the same buffers the relays ask for */
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr = bind_ip};
	if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
		perror("bind");
		exit(1);
	}
	return fd;
}

static int port_of(int fd) {
	struct sockaddr_in a;
	socklen_t l = sizeof a;
	getsockname(fd, (struct sockaddr *)&a, &l);
	return ntohs(a.sin_port);
}

/* Per-direction state, allocated once. */
struct dir {
	struct mmsghdr in[MAXBATCH], out[MAXBATCH];
	struct iovec inv[MAXBATCH], outv[MAXBATCH][2];
	struct sockaddr_in from[MAXBATCH], to[MAXBATCH];
	unsigned char buf[MAXBATCH][BUFLEN];
	unsigned char hdr[MAXBATCH][HDRLEN];
};

static struct dir up, down;

static void setup(struct dir *d, int batch) {
	for (int i = 0; i < batch; i++) {
		d->inv[i].iov_base = d->buf[i];
		d->inv[i].iov_len = BUFLEN;
		d->in[i].msg_hdr.msg_iov = &d->inv[i];
		d->in[i].msg_hdr.msg_iovlen = 1;
		d->in[i].msg_hdr.msg_name = &d->from[i];
		d->in[i].msg_hdr.msg_namelen = sizeof d->from[i];
		d->out[i].msg_hdr.msg_iov = d->outv[i];
		d->out[i].msg_hdr.msg_name = &d->to[i];
		d->out[i].msg_hdr.msg_namelen = sizeof d->to[i];
	}
}

static void send_all(int fd, struct mmsghdr *m, int k) {
	for (int sent = 0; sent < k;) {
		int r = sendmmsg(fd, m + sent, k - sent, 0);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			sent++; /* skip the datagram that failed, like the relays */
			continue;
		}
		sent += r;
	}
}

/* client -> target: put the header in front, send from back. */
static void forward_up(int front, int back, struct sockaddr_in *target, int batch) {
	for (int i = 0; i < batch; i++)
		up.in[i].msg_hdr.msg_namelen = sizeof up.from[i];
	int n = recvmmsg(front, up.in, batch, MSG_WAITFORONE, NULL);
	if (n <= 0)
		return;
	for (int i = 0; i < n; i++) {
		unsigned char *h = up.hdr[i];
		h[0] = MAGIC;
		h[1] = 0;
		memcpy(h + 2, &up.from[i].sin_port, 2);
		memcpy(h + 4, &up.from[i].sin_addr.s_addr, 4);
		up.outv[i][0].iov_base = h;
		up.outv[i][0].iov_len = HDRLEN;
		up.outv[i][1].iov_base = up.buf[i];
		up.outv[i][1].iov_len = up.in[i].msg_len;
		up.out[i].msg_hdr.msg_iovlen = 2;
		up.to[i] = *target;
	}
	send_all(back, up.out, n);
}

/* target -> client: read the header, send the rest from front. */
static void forward_down(int back, int front, int batch) {
	for (int i = 0; i < batch; i++)
		down.in[i].msg_hdr.msg_namelen = sizeof down.from[i];
	int n = recvmmsg(back, down.in, batch, MSG_WAITFORONE, NULL);
	if (n <= 0)
		return;
	int k = 0;
	for (int i = 0; i < n; i++) {
		unsigned char *b = down.buf[i];
		if (down.in[i].msg_len <= HDRLEN || b[0] != MAGIC)
			continue; /* dropped */
		struct sockaddr_in *to = &down.to[k];
		to->sin_family = AF_INET;
		memcpy(&to->sin_port, b + 2, 2);
		memcpy(&to->sin_addr.s_addr, b + 4, 4);
		down.outv[k][0].iov_base = b + HDRLEN;
		down.outv[k][0].iov_len = down.in[i].msg_len - HDRLEN;
		down.out[k].msg_hdr.msg_iovlen = 1;
		k++;
	}
	send_all(front, down.out, k);
}

static int front, back, batch;
static struct sockaddr_in target;

static void *run_up(void *arg) {
	(void)arg;
	for (;;)
		forward_up(front, back, &target, batch);
	return NULL;
}

static void *run_down(void *arg) {
	(void)arg;
	for (;;)
		forward_down(back, front, batch);
	return NULL;
}

int main(int argc, char **argv) {
	if (argc < 3) {
		fprintf(stderr, "usage: fwd <target-ip> <target-port> [batch [bind-ip]]\n");
		return 2;
	}
	target.sin_family = AF_INET;
	target.sin_port = htons(atoi(argv[2]));
	if (inet_pton(AF_INET, argv[1], &target.sin_addr) != 1) {
		fprintf(stderr, "fwd: bad target %s\n", argv[1]);
		return 2;
	}
	batch = argc > 3 ? atoi(argv[3]) : 32;
	bind_ip.s_addr = htonl(INADDR_LOOPBACK);
	if (argc > 4 && inet_pton(AF_INET, argv[4], &bind_ip) != 1) {
		fprintf(stderr, "fwd: bad bind address %s\n", argv[4]);
		return 2;
	}
	if (batch < 1 || batch > MAXBATCH)
		batch = 32;
	signal(SIGPIPE, SIG_IGN);
	front = open_socket();
	back = open_socket();
	setup(&up, batch);
	setup(&down, batch);
	pthread_t t1, t2;
	if (pthread_create(&t1, NULL, run_up, NULL) || pthread_create(&t2, NULL, run_down, NULL)) {
		fprintf(stderr, "fwd: pthread_create failed\n");
		return 1;
	}
	printf("front %d back %d\n", port_of(front), port_of(back));
	fflush(stdout);
	char c;
	while (read(0, &c, 1) > 0) {
	}
	return 0; /* stdin closed: the parent is gone */
}
