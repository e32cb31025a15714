/* A learning Ethernet switch that holds every frame for a fixed delay: the benchmark's stand-in for
 * `tc netem delay` on kernels built without sch_netem (benchmarks/dra_bench/_netns.py). It runs in
 * the hub namespace, one AF_PACKET socket per port (the hub ends of the ranks' veth pairs), and
 * forwards each frame `delay_us` after it arrived: learned destination, else every other port.
 * Frames keep their virtio-net header (PACKET_VNET_HDR), so TCP segmentation and checksum offload
 * pass through unchanged and the ports' qdiscs (tbf) shape what it sends.
 *
 * Usage: dra_delay_switch <delay_us> <ifname>...   Prints "ready" once every port is open; runs
 * until SIGTERM. Counters go to stderr at exit. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/types.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_PORTS 64
#define FRAME_MAX (65536 + 64)
#define QUEUE_MAX 65536 /* frames held at once: > a bandwidth-delay product of GSO frames */

struct held {
  uint64_t due_ns;
  int in_port;
  int len;
  unsigned char *data;
};

static volatile sig_atomic_t stop = 0;
static void on_term(int sig) { (void)sig; stop = 1; }

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s <delay_us> <ifname>...\n", argv[0]);
    return 2;
  }
  const uint64_t delay_ns = strtoull(argv[1], NULL, 10) * 1000ull;
  const int nports = argc - 2;
  if (nports > MAX_PORTS) return 2;
  int fd[MAX_PORTS];
  int ifindex[MAX_PORTS];
  unsigned char mac[256][6]; /* learned: MAC -> port, a tiny table */
  int mac_port[256];
  int nmac = 0;
  for (int i = 0; i < nports; ++i) {
    fd[i] = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    if (fd[i] < 0) { perror("socket"); return 1; }
    int on = 1;
    if (setsockopt(fd[i], SOL_PACKET, PACKET_VNET_HDR, &on, sizeof on) < 0) { perror("PACKET_VNET_HDR"); return 1; }
    ifindex[i] = (int)if_nametoindex(argv[2 + i]);
    if (!ifindex[i]) { fprintf(stderr, "no interface %s\n", argv[2 + i]); return 1; }
    struct sockaddr_ll sll;
    memset(&sll, 0, sizeof sll);
    sll.sll_family = AF_PACKET;
    sll.sll_protocol = htons(ETH_P_ALL);
    sll.sll_ifindex = ifindex[i];
    if (bind(fd[i], (struct sockaddr *)&sll, sizeof sll) < 0) { perror("bind"); return 1; }
    int big = 8 << 20;
    setsockopt(fd[i], SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big);
    setsockopt(fd[i], SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big);
  }
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  struct held *q = calloc(QUEUE_MAX, sizeof *q);
  if (!q) return 1;
  size_t head = 0, count = 0;
  unsigned long long forwarded = 0, dropped = 0, flooded = 0;
  printf("ready\n");
  fflush(stdout);
  struct pollfd pfd[MAX_PORTS];
  for (int i = 0; i < nports; ++i) pfd[i] = (struct pollfd){fd[i], POLLIN, 0};
  const size_t vnet = 10; /* struct virtio_net_hdr */
  while (!stop) {
    /* Release every frame that is due (one delay for all: the queue is in arrival order). */
    uint64_t t = now_ns();
    while (count > 0 && q[head].due_ns <= t) {
      struct held *h = &q[head];
      const unsigned char *dst = h->data + vnet;
      int out = -1;
      if (!(dst[0] & 1))
        for (int k = 0; k < nmac; ++k)
          if (memcmp(mac[k], dst, 6) == 0) { out = mac_port[k]; break; }
      for (int p = 0; p < nports; ++p) {
        if (p == h->in_port || (out >= 0 && p != out)) continue;
        if (send(fd[p], h->data, (size_t)h->len, 0) < 0) ++dropped; else ++forwarded;
        if (out < 0) ++flooded;
      }
      free(h->data);
      head = (head + 1) % QUEUE_MAX;
      --count;
    }
    struct timespec wait = {0, 100000000}; /* idle: wake up every 100 ms to check for SIGTERM */
    if (count > 0) {
      const uint64_t left = q[head].due_ns > t ? q[head].due_ns - t : 0;
      wait = (struct timespec){(time_t)(left / 1000000000ull), (long)(left % 1000000000ull)};
    }
    if (ppoll(pfd, (nfds_t)nports, &wait, NULL) < 0 && errno != EINTR) {
      perror("ppoll");
      break;
    }
    for (int i = 0; i < nports; ++i) {
      if (!(pfd[i].revents & POLLIN)) continue;
      for (;;) {
        static unsigned char frame[FRAME_MAX];
        struct sockaddr_ll from;
        socklen_t fl = sizeof from;
        ssize_t len = recvfrom(fd[i], frame, FRAME_MAX, MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
        if (len <= 0) break;
        unsigned char *buf = malloc((size_t)len);
        if (!buf) return 1;
        memcpy(buf, frame, (size_t)len);
        if (from.sll_pkttype == PACKET_OUTGOING || (size_t)len < vnet + 14) { free(buf); continue; }
        const unsigned char *src = buf + vnet + 6;
        int known = 0;
        for (int k = 0; k < nmac; ++k)
          if (memcmp(mac[k], src, 6) == 0) { mac_port[k] = i; known = 1; break; }
        if (!known && nmac < 256) { memcpy(mac[nmac], src, 6); mac_port[nmac++] = i; }
        if (count == QUEUE_MAX) { free(buf); ++dropped; continue; }
        struct held *h = &q[(head + count) % QUEUE_MAX];
        *h = (struct held){now_ns() + delay_ns, i, (int)len, buf};
        ++count;
      }
    }
  }
  fprintf(stderr, "forwarded %llu flooded %llu dropped %llu\n", forwarded, flooded, dropped);
  return 0;
}
