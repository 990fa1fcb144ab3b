/* rendezvous.c: rank 0 hands the other ranks of a job what they need to join
 * it (the shared segment's name, the NCCL id), and only to them (DESIGN.md,
 * "Processes" and "Errors"; the threat model: docs/hostile-input.md).
 *
 * Where it sits among comm's files (calls go down only, no circle):
 *
 *   main.c -> comm_launch.c (who this process is; the job token) -> rendezvous.c
 *   comm.c -> comm_nccl.c  (the NCCL id)                          -> rendezvous.c
 *          -> comm_shm.c   (the segment's name)                   -> rendezvous.c
 *
 * comm.c dispatches to the two backends, which never call each other; both,
 * and the launcher (for the token), call this file; this file calls the C
 * library only. What the comm files share besides (the segment's header, the
 * way a rank dies) is comm_impl.h's inline code, below them all.
 *
 * The exchange, one TCP connection a client (integers 4 bytes, big-endian;
 * K the job token, Cs rank 0's fresh challenge, Nc the client's nonce, D the
 * SHA-256 of the client's agreement items):
 *
 *   rank 0 -> client   "TRNRDZV1" Cs
 *   client -> rank 0   rank Nc D  HMAC(K, "join" Cs rank Nc D)
 *   rank 0 -> client   status len payload  HMAC(K, "root" Cs Nc rank status len payload)
 *                      SERVED: payload = the blob (D equals rank 0's digest)
 *                      DIFFER: payload = rank 0's items, so the client can name the first
 *                              that differs
 *                      TWICE (rank already served), NOT_RANK (not 1..W-1): payload = W
 *                      REFUSED: the join's HMAC is wrong; no payload, no HMAC
 *   client -> rank 0   (after DIFFER) index len item  HMAC(K, "differ" Cs Nc index len item)
 *
 * So the token never crosses the wire, nothing a rank needs is sent before
 * the client proved it, and the client knows rank 0 is this job's (its HMAC)
 * before it believes the blob. A fresh challenge a connection makes a
 * recorded answer useless. Rank 0 serves up to MAX_CONN clients at once with
 * poll, each with its own deadline (CLIENT_S), so silent or slow clients
 * cost nobody else any time; when all slots are taken, the oldest client
 * that has not proven the token gives its slot up.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include "rendezvous.h"

#define MAX_CONN 64              /* clients rank 0 serves at once */
#define CLIENT_S 10.0            /* rank 0: a client's whole exchange; a client: each answer of rank 0 */
#define CONNECT_S 5.0            /* a client: one try to connect */
#define RETRY_NS 200000000L      /* a client: between tries */
#define MAX_PAYLOAD (1u << 20)   /* what a client accepts in one answer */
#define MAX_ITEM 4096            /* what rank 0 accepts as the differing item */
#define MAX_NOTICES 4            /* rank 0: lines about clients turned away */

enum { ST_SERVED = 0, ST_DIFFER = 1, ST_TWICE = 2, ST_NOT_RANK = 3, ST_REFUSED = 4 };

static const char MAGIC[8] = { 'T', 'R', 'N', 'R', 'D', 'Z', 'V', '1' };

/* ---- SHA-256 (FIPS 180-4, section 6.2) --------------------------------------------- */

/* The first 32 bits of the fractional parts of the cube roots of the first
 * 64 primes (section 4.2.2). */
static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror(uint32_t x, int n) { return x >> n | x << (32 - n); }

static uint32_t load_be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void store_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

/* One 64-byte block into the hash (section 6.2.2). */
static void sha256_block(uint32_t h[8], const unsigned char *blk) {
    uint32_t w[64];   /* the message schedule */
    for (int t = 0; t < 16; t++) w[t] = load_be32(blk + 4 * t);
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = ror(w[t - 15], 7) ^ ror(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = ror(w[t - 2], 17) ^ ror(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K256[t] + w[t];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

void rdzv_sha256_init(RdzvSha256 *s) {
    /* the first 32 bits of the fractional parts of the square roots of the first 8 primes */
    static const uint32_t h0[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
    memcpy(s->h, h0, sizeof h0);
    s->bytes = 0;
    s->fill = 0;
}

void rdzv_sha256_update(RdzvSha256 *s, const void *p, size_t n) {
    const unsigned char *b = p;
    s->bytes += n;
    while (n) {
        size_t k = 64 - s->fill < n ? 64 - s->fill : n;
        memcpy(s->block + s->fill, b, k);
        s->fill += k;
        b += k;
        n -= k;
        if (s->fill == 64) { sha256_block(s->h, s->block); s->fill = 0; }
    }
}

/* Section 5.1.1: a 1 bit, zeros to 56 mod 64 bytes, the length in bits (64 bits). */
void rdzv_sha256_final(RdzvSha256 *s, unsigned char out[32]) {
    uint64_t bits = s->bytes * 8;
    unsigned char pad[72] = { 0x80 };
    size_t npad = (s->fill < 56 ? 56 : 120) - s->fill;
    for (int i = 0; i < 8; i++) pad[npad + i] = (unsigned char)(bits >> (56 - 8 * i));
    rdzv_sha256_update(s, pad, npad + 8);
    for (int i = 0; i < 8; i++) store_be32(out + 4 * i, s->h[i]);
}

void rdzv_sha256(const void *p, size_t n, unsigned char out[32]) {
    RdzvSha256 s;
    rdzv_sha256_init(&s);
    rdzv_sha256_update(&s, p, n);
    rdzv_sha256_final(&s, out);
}

/* HMAC over several pieces: H((K ^ opad) || H((K ^ ipad) || pieces)). */
typedef struct Piece { const void *p; size_t n; } Piece;

static void hmac_pieces(const void *key, size_t klen, const Piece *pc, int np, unsigned char out[32]) {
    unsigned char k[64] = { 0 }, pad[64], inner[32];
    if (klen > 64) rdzv_sha256(key, klen, k);
    else if (klen) memcpy(k, key, klen);
    RdzvSha256 s;
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    rdzv_sha256_init(&s);
    rdzv_sha256_update(&s, pad, 64);
    for (int i = 0; i < np; i++) rdzv_sha256_update(&s, pc[i].p, pc[i].n);
    rdzv_sha256_final(&s, inner);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    rdzv_sha256_init(&s);
    rdzv_sha256_update(&s, pad, 64);
    rdzv_sha256_update(&s, inner, 32);
    rdzv_sha256_final(&s, out);
}

void rdzv_hmac(const void *key, size_t klen, const void *msg, size_t n, unsigned char out[32]) {
    Piece pc = { msg, n };
    hmac_pieces(key, klen, &pc, 1, out);
}

/* ---- the token, randomness ---------------------------------------------------------- */

void rdzv_token_derive(const char *secret, const char *identity, unsigned char token[RDZV_TOKEN_BYTES]) {
    static const char label[] = "train job";   /* with its terminating 0 */
    Piece pc[2] = { { label, sizeof label }, { identity ? identity : "", identity ? strlen(identity) : 0 } };
    hmac_pieces(secret ? secret : "", secret ? strlen(secret) : 0, pc, 2, token);
}

static int random_bytes(void *p, size_t n) {
    unsigned char *b = p;
    while (n) {
        ssize_t k = getrandom(b, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

int rdzv_token_random(unsigned char token[RDZV_TOKEN_BYTES], char *err, size_t errlen) {
    if (random_bytes(token, RDZV_TOKEN_BYTES) == 0) return 0;
    snprintf(err, errlen, "cannot draw a random job token (getrandom: %s)", strerror(errno));
    return -1;
}

/* ---- small things ---------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int same_mac(const unsigned char *a, const unsigned char *b) {
    unsigned char d = 0;   /* every byte compared: the time says nothing of where they differ */
    for (int i = 0; i < 32; i++) d |= a[i] ^ b[i];
    return d == 0;
}

/* The SHA-256 of the items, each with its length, in order. */
static void items_digest(const RdzvJob *j, unsigned char out[32]) {
    RdzvSha256 s;
    unsigned char n[4];
    rdzv_sha256_init(&s);
    store_be32(n, (uint32_t)j->nitems);
    rdzv_sha256_update(&s, n, 4);
    for (int i = 0; i < j->nitems; i++) {
        size_t len = strlen(j->items[i]);
        store_be32(n, (uint32_t)len);
        rdzv_sha256_update(&s, n, 4);
        rdzv_sha256_update(&s, j->items[i], len);
    }
    rdzv_sha256_final(&s, out);
}

/* "layers" of "layers=2" (the whole item when it has no '='). */
static void item_name(const char *item, char *name, size_t len) {
    const char *eq = strchr(item, '=');
    size_t n = eq ? (size_t)(eq - item) : strlen(item);
    if (n >= len) n = len - 1;
    memcpy(name, item, n);
    name[n] = 0;
}

/* The message both sides print: "rank 1 does not agree with rank 0 on layers: ..." */
static void differ_message(char *err, size_t errlen, int me, int other, const char *mine, const char *theirs) {
    char name[64];
    item_name(*mine ? mine : theirs, name, sizeof name);
    snprintf(err, errlen, "rank %d does not agree with rank %d on %s: rank %d has %s, rank %d has %s (every rank "
             "of a job must be started with the same model, layout, data and program)", other, me, name, other,
             *theirs ? theirs : "nothing", me, *mine ? mine : "nothing");
}

/* The join's and the answers' HMACs. */
static void mac_join(const RdzvJob *j, const unsigned char *cs, const unsigned char *m2, unsigned char out[32]) {
    Piece pc[3] = { { "join", 4 }, { cs, 32 }, { m2, 4 + 32 + 32 } };   /* rank Nc D */
    hmac_pieces(j->token, RDZV_TOKEN_BYTES, pc, 3, out);
}

static void mac_answer(const RdzvJob *j, const char *label, const unsigned char *cs, const unsigned char *nc,
                       uint32_t rank, const unsigned char *msg, size_t n, unsigned char out[32]) {
    unsigned char r[4];
    store_be32(r, rank);
    Piece pc[5] = { { label, strlen(label) }, { cs, 32 }, { nc, 32 }, { r, 4 }, { msg, n } };
    hmac_pieces(j->token, RDZV_TOKEN_BYTES, pc, 5, out);
}

/* ---- rank 0: serving every other rank at once ---------------------------------------- */

typedef enum { C_JOIN, C_DIFFER, C_CLOSE } ConnState;

typedef struct Conn {
    int fd;
    ConnState state;
    double deadline;
    char peer[64];                /* "127.0.0.1:40112" */
    unsigned char cs[32];         /* the challenge it was sent */
    unsigned char nc[32];         /* its nonce, once it joined */
    uint32_t rank;                /* the rank it claims */
    int claimed;                  /* the rank is its own once its answer is out */
    unsigned char in[8 + MAX_ITEM + 32];
    size_t nin, want;             /* bytes read, bytes the current message has */
    unsigned char *out;           /* what is left to send */
    size_t nout, sent;
} Conn;

typedef struct Server {
    const RdzvJob *j;
    const void *blob;
    size_t len;
    unsigned char digest[32];
    int lfd, nconn;
    Conn conn[MAX_CONN];
    char *served;                 /* [world] 1 once the rank has its blob */
    char *claimed;                /* [world] 1 while a connection is sending it */
    int nserved, notices;
    int failed;                   /* RDZV_MISMATCH once a rank differs */
    int *held;                    /* [world] served ranks' connections, kept (rdzv_bcast_hold); or NULL */
    char *err;
    size_t errlen;
} Server;

static void conn_close(Server *s, int i) {
    Conn *c = &s->conn[i];
    if (c->claimed) s->claimed[c->rank] = 0;
    if (c->fd >= 0) close(c->fd);
    free(c->out);
    s->conn[i] = s->conn[--s->nconn];
}

static void notice(Server *s, const Conn *c, const char *what) {
    if (s->notices++ < MAX_NOTICES)
        fprintf(stderr, "train: rank 0: rendezvous: turned away %s (claiming rank %u): %s%s\n", c->peer, c->rank,
                what, s->notices == MAX_NOTICES ? " (further ones are not shown)" : "");
}

/* Queues an answer of `status`, with its HMAC unless REFUSED. */
static int conn_answer(Server *s, Conn *c, uint32_t status, const unsigned char *payload, size_t n) {
    size_t total = 8 + n + (status == ST_REFUSED ? 0 : 32);
    free(c->out);
    c->out = malloc(total);
    if (!c->out) return -1;
    store_be32(c->out, status);
    store_be32(c->out + 4, (uint32_t)n);
    if (n) memcpy(c->out + 8, payload, n);
    if (status != ST_REFUSED) mac_answer(s->j, "root", c->cs, c->nc, c->rank, c->out, 8 + n, c->out + 8 + n);
    c->nout = total;
    c->sent = 0;
    return 0;
}

/* Rank 0's items as a payload: count, then each with its length. */
static unsigned char *items_payload(const RdzvJob *j, size_t *n) {
    size_t total = 4;
    for (int i = 0; i < j->nitems; i++) total += 4 + strlen(j->items[i]);
    unsigned char *p = malloc(total), *q = p;
    if (!p) return NULL;
    store_be32(q, (uint32_t)j->nitems);
    q += 4;
    for (int i = 0; i < j->nitems; i++) {
        size_t len = strlen(j->items[i]);
        store_be32(q, (uint32_t)len);
        memcpy(q + 4, j->items[i], len);
        q += 4 + len;
    }
    *n = total;
    return p;
}

/* The join is in c->in: check it, answer. 0, or -1 to drop the connection. */
static int conn_joined(Server *s, Conn *c) {
    const RdzvJob *j = s->j;
    unsigned char mac[32], w[4];
    c->rank = load_be32(c->in);
    memcpy(c->nc, c->in + 4, 32);
    mac_join(j, c->cs, c->in, mac);
    c->state = C_CLOSE;
    if (!same_mac(mac, c->in + 68)) {
        notice(s, c, "it did not prove this job's token");
        return conn_answer(s, c, ST_REFUSED, NULL, 0);
    }
    store_be32(w, (uint32_t)j->world_size);
    if (memcmp(c->in + 36, s->digest, 32) != 0) {   /* same job, another configuration */
        size_t n;
        unsigned char *items = items_payload(j, &n);
        int rc = items ? conn_answer(s, c, ST_DIFFER, items, n) : -1;
        free(items);
        c->state = C_DIFFER;
        c->nin = 0;
        c->want = 8;
        c->deadline = now_s() + CLIENT_S;
        return rc;
    }
    if (c->rank < 1 || c->rank >= (uint32_t)j->world_size) return conn_answer(s, c, ST_NOT_RANK, w, 4);
    if (s->served[c->rank] || s->claimed[c->rank]) {
        notice(s, c, "that rank has joined already");
        return conn_answer(s, c, ST_TWICE, w, 4);
    }
    s->claimed[c->rank] = 1;
    c->claimed = 1;
    return conn_answer(s, c, ST_SERVED, s->blob, s->len);
}

/* The differing item is in c->in (index len item mac): the job stops. */
static void conn_differ(Server *s, Conn *c) {
    const RdzvJob *j = s->j;
    unsigned char mac[32];
    uint32_t idx = load_be32(c->in), said = load_be32(c->in + 4), n = said > MAX_ITEM ? MAX_ITEM : said;
    mac_answer(j, "differ", c->cs, c->nc, c->rank, c->in, 8 + n, mac);
    s->failed = RDZV_MISMATCH;
    if (said > MAX_ITEM || !same_mac(mac, c->in + 8 + n)) {
        snprintf(s->err, s->errlen, "rank %u's configuration differs from rank 0's (the digest of what the ranks "
                 "must agree on), and its answer did not say where", c->rank);
        return;
    }
    char theirs[MAX_ITEM + 1];
    memcpy(theirs, c->in + 8, n);
    theirs[n] = 0;
    differ_message(s->err, s->errlen, 0, (int)c->rank, idx < (uint32_t)j->nitems ? j->items[idx] : "", theirs);
}

/* Reads what is there into c; -1 on EOF or error. */
static int conn_read(Server *s, Conn *c) {
    ssize_t k = recv(c->fd, c->in + c->nin, c->want - c->nin, 0);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (k <= 0) return -1;
    c->nin += (size_t)k;
    if (c->nin < c->want) return 0;
    if (c->state == C_JOIN) return conn_joined(s, c);
    if (c->state == C_DIFFER) {
        uint32_t n = load_be32(c->in + 4);
        if (n > MAX_ITEM) n = MAX_ITEM;   /* the HMAC then fails: said so */
        if (c->want == 8) { c->want = 8 + n + 32; return 0; }
        conn_differ(s, c);
    }
    return 0;
}

/* Sends what it can; 1 once everything is out. */
static int conn_write(Conn *c) {
    while (c->sent < c->nout) {
        ssize_t k = send(c->fd, c->out + c->sent, c->nout - c->sent, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return errno == EAGAIN ? 0 : -1;
        c->sent += (size_t)k;
    }
    return 1;
}

static void conn_accept(Server *s) {
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    int fd = accept4(s->lfd, (struct sockaddr *)&a, &al, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (s->nconn == MAX_CONN) {   /* the oldest that has not proven the token makes room */
        int oldest = -1;
        for (int i = 0; i < s->nconn; i++)
            if (s->conn[i].state == C_JOIN && (oldest < 0 || s->conn[i].deadline < s->conn[oldest].deadline))
                oldest = i;
        if (oldest < 0) { close(fd); return; }
        conn_close(s, oldest);
    }
    Conn *c = &s->conn[s->nconn];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->state = C_JOIN;
    c->want = 4 + 32 + 32 + 32;
    c->deadline = now_s() + CLIENT_S;
    c->rank = 0;
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
    snprintf(c->peer, sizeof c->peer, "%s:%d", ip, ntohs(a.sin_port));
    c->out = malloc(40);
    if (!c->out || random_bytes(c->cs, 32)) { free(c->out); close(fd); return; }
    memcpy(c->out, MAGIC, 8);
    memcpy(c->out + 8, c->cs, 32);
    c->nout = 40;
    s->nconn++;
    if (conn_write(c) < 0) conn_close(s, s->nconn - 1);
}

/* Where rank 0 listens: the address MASTER_ADDR names when it is one of this
 * host's; every address when it is unset, or a name that resolves to a
 * loopback address here (Debian's 127.0.1.1: other hosts reach that name at
 * another address), or not this host's (bind says EADDRNOTAVAIL). */
static int server_listen(const RdzvJob *j, char *err, size_t errlen) {
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)j->port),
                             .sin_addr.s_addr = htonl(INADDR_ANY) };
    const char *addr = j->addr && *j->addr ? j->addr : NULL;
    if (addr && !strcmp(addr, "localhost")) {
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else if (addr && inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
        struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai = NULL;
        if (getaddrinfo(addr, NULL, &hints, &ai) == 0 && ai) {
            struct in_addr in = ((struct sockaddr_in *)ai->ai_addr)->sin_addr;
            if ((ntohl(in.s_addr) >> 24) != 127) a.sin_addr = in;
        }
        if (ai) freeaddrinfo(ai);
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    if (rc != 0 && errno == EADDRNOTAVAIL) {
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    }
    if (rc != 0 || listen(fd, 128) != 0) {
        snprintf(err, errlen, "rank 0 cannot listen on port %d (%s): %s", j->port, j->port_name, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* "ranks 2 and 3" of those not served. */
static void missing(const Server *s, char *buf, size_t len) {
    int W = s->j->world_size, n = 0, shown = 0;
    for (int r = 1; r < W; r++) n += !s->served[r];
    size_t k = (size_t)snprintf(buf, len, "rank%s", n > 1 ? "s" : "");
    for (int r = 1; r < W && k + 16 < len; r++) {
        if (s->served[r]) continue;
        shown++;
        k += (size_t)snprintf(buf + k, len - k, "%s%d", shown == 1 ? " " : shown == n ? " and " : ", ", r);
        if (shown == 8 && n > 9) { snprintf(buf + k, len - k, " and %d more", n - 8); break; }
    }
}

static int serve(const RdzvJob *j, const void *blob, size_t len, int *held, char *err, size_t errlen) {
    Server *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, errlen, "out of memory for the rendezvous"); return -1; }
    s->j = j; s->blob = blob; s->len = len; s->err = err; s->errlen = errlen; s->held = held;
    s->served = calloc((size_t)j->world_size, 1);
    s->claimed = calloc((size_t)j->world_size, 1);
    items_digest(j, s->digest);
    int rc = -1;
    s->lfd = -1;
    if (!s->served || !s->claimed) { snprintf(err, errlen, "out of memory for the rendezvous"); goto done; }
    if ((s->lfd = server_listen(j, err, errlen)) < 0) goto done;
    double deadline = now_s() + j->timeout_s;
    struct pollfd pf[1 + MAX_CONN];
    while (s->nserved < j->world_size - 1 && !s->failed) {
        double now = now_s(), wake = deadline;
        if (now >= deadline) {
            char who[160];
            missing(s, who, sizeof who);
            snprintf(err, errlen, "%s of %d did not reach rank 0 on port %d (%s) within %g s", who, j->world_size,
                     j->port, j->port_name, j->timeout_s);
            goto done;
        }
        int n = s->nconn;
        pf[0] = (struct pollfd){ s->lfd, POLLIN, 0 };
        for (int i = 0; i < n; i++) {
            Conn *c = &s->conn[i];
            short want = c->sent < c->nout ? POLLOUT : c->nin < c->want ? POLLIN : 0;
            pf[1 + i] = (struct pollfd){ c->fd, want, 0 };
            if (c->deadline < wake) wake = c->deadline;
        }
        poll(pf, (nfds_t)(1 + n), (int)((wake - now) * 1000) + 1);
        now = now_s();
        for (int i = n - 1; i >= 0; i--) {   /* from the end: closing moves the last one into i */
            Conn *c = &s->conn[i];
            short ev = pf[1 + i].revents;
            int drop = now >= c->deadline;
            if (!drop && (ev & POLLOUT)) drop = conn_write(c) < 0;
            if (!drop && (ev & (POLLIN | POLLHUP | POLLERR)) && c->nin < c->want && c->sent == c->nout)
                drop = conn_read(s, c) < 0;
            if (!drop && c->sent < c->nout && conn_write(c) < 0) drop = 1;   /* an answer just queued */
            if (!drop && c->state == C_CLOSE && c->sent == c->nout) {
                if (c->claimed) {
                    s->served[c->rank] = 1;
                    s->nserved++;
                    c->claimed = 0;
                    if (s->held) { s->held[c->rank] = c->fd; c->fd = -1; }
                }
                drop = 1;
            }
            if (drop && c->state == C_DIFFER && !s->failed) {   /* it differs, and said nothing more */
                s->failed = RDZV_MISMATCH;
                snprintf(err, errlen, "rank %u's configuration differs from rank 0's (the digest of what the "
                         "ranks must agree on), and it did not say where", c->rank);
            }
            if (drop) conn_close(s, i);
        }
        if (pf[0].revents & POLLIN)
            for (int k = 0; k < 16; k++) {   /* a burst of connections, a few at a time */
                int before = s->nconn;
                conn_accept(s);
                if (s->nconn == before) break;
            }
    }
    rc = s->failed ? s->failed : 0;
done:
    while (s->nconn) conn_close(s, s->nconn - 1);
    if (s->lfd >= 0) close(s->lfd);
    free(s->served);
    free(s->claimed);
    free(s);
    return rc;
}

/* ---- the other ranks: fetching ------------------------------------------------------- */

/* Reads or writes n bytes on fd by the deadline; -1 (errno) on timeout, EOF, error. */
static int io_full(int fd, void *p, size_t n, int writing, double deadline) {
    char *b = p;
    while (n) {
        struct pollfd pf = { fd, writing ? POLLOUT : POLLIN, 0 };
        int ms = (int)((deadline - now_s()) * 1000);
        if (ms <= 0) { errno = ETIMEDOUT; return -1; }
        if (poll(&pf, 1, ms) <= 0) continue;
        ssize_t k = writing ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k <= 0) { if (k == 0) errno = ECONNRESET; return -1; }
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

/* A connection to ai within CONNECT_S; -1 with errno. */
static int connect_by(const struct addrinfo *ai, double deadline) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) goto fail;
    struct pollfd pf = { fd, POLLOUT, 0 };
    int ms = (int)((deadline - now_s()) * 1000);
    if (ms < 1) ms = 1;
    if (poll(&pf, 1, ms) != 1) { errno = ETIMEDOUT; goto fail; }
    int e = 0;
    socklen_t el = sizeof e;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
    if (e) { errno = e; goto fail; }
    return fd;
fail:;
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

/* The client's item at index i, or "" past its end. */
static const char *item_at(const RdzvJob *j, uint32_t i) { return i < (uint32_t)j->nitems ? j->items[i] : ""; }

/* DIFFER: finds the first item of payload[n] (rank 0's) that differs from
 * ours, tells rank 0, and fills err. */
static int fetch_differ(const RdzvJob *j, int fd, const unsigned char *cs, const unsigned char *nc,
                        const unsigned char *p, size_t n, char *err, size_t errlen) {
    uint32_t count = n >= 4 ? load_be32(p) : 0, i = 0;
    size_t off = 4;
    char theirs[MAX_ITEM + 1] = "";
    for (;; i++) {
        const char *mine = item_at(j, i);
        uint32_t len = 0;
        int have = i < count && off + 4 <= n && (len = load_be32(p + off)) <= n - off - 4 && len <= MAX_ITEM;
        if (have) {
            memcpy(theirs, p + off + 4, len);
            theirs[len] = 0;
            off += 4 + len;
        } else {
            theirs[0] = 0;
        }
        if (!have && i >= (uint32_t)j->nitems) break;   /* none differs: a digest of another kind */
        if (strcmp(mine, theirs) != 0) break;
    }
    const char *mine = item_at(j, i);
    size_t ml = strlen(mine) > MAX_ITEM ? MAX_ITEM : strlen(mine);
    unsigned char *m = malloc(8 + ml + 32);
    if (m) {
        store_be32(m, i);
        store_be32(m + 4, (uint32_t)ml);
        memcpy(m + 8, mine, ml);
        mac_answer(j, "differ", cs, nc, (uint32_t)j->rank, m, 8 + ml, m + 8 + ml);
        io_full(fd, m, 8 + ml + 32, 1, now_s() + CLIENT_S);
        free(m);
    }
    differ_message(err, errlen, j->rank, 0, mine, theirs);
    return RDZV_MISMATCH;
}

/* One try on a connection: 0 served, 1 try again (why says why), or a final
 * -1 / RDZV_MISMATCH with err. */
static int fetch_once(const RdzvJob *j, int fd, void *blob, size_t len, char *why, size_t whylen, char *err,
                      size_t errlen) {
    /* (fd stays open for the caller, who closes it) */
    unsigned char hello[40], m2[100], head[8], mac[32];
    double t = now_s() + CLIENT_S;
    if (io_full(fd, hello, 40, 0, t) != 0) { snprintf(why, whylen, "no greeting: %s", strerror(errno)); return 1; }
    if (memcmp(hello, MAGIC, 8) != 0) { snprintf(why, whylen, "what listens there is not train's rendezvous"); return 1; }
    const unsigned char *cs = hello + 8, *nc = m2 + 4;
    unsigned char digest[32];
    items_digest(j, digest);
    store_be32(m2, (uint32_t)j->rank);
    if (random_bytes(m2 + 4, 32)) { snprintf(err, errlen, "getrandom: %s", strerror(errno)); return -1; }
    memcpy(m2 + 36, digest, 32);
    mac_join(j, cs, m2, m2 + 68);
    if (io_full(fd, m2, 100, 1, t) != 0 || io_full(fd, head, 8, 0, now_s() + CLIENT_S) != 0) {
        snprintf(why, whylen, "rank 0 closed the connection: %s", strerror(errno));
        return 1;
    }
    uint32_t status = load_be32(head), n = load_be32(head + 4);
    if (status == ST_REFUSED) {
        snprintf(err, errlen, "rank 0 at %s:%d (%s) turned rank %d away: its job token (from %s) is not this "
                 "rank's: another job holds this port, or this rank was started as part of another job", j->addr,
                 j->port, j->port_name, j->rank, j->token_from);
        return -1;
    }
    if (n > MAX_PAYLOAD) { snprintf(why, whylen, "an answer of %u bytes", n); return 1; }
    unsigned char *p = malloc((size_t)n + 8 + 32);
    if (!p) { snprintf(err, errlen, "out of memory"); return -1; }
    memcpy(p, head, 8);
    int rc = 1;
    if (io_full(fd, p + 8, (size_t)n + 32, 0, now_s() + CLIENT_S) != 0) {
        snprintf(why, whylen, "rank 0's answer was cut short: %s", strerror(errno));
        goto done;
    }
    mac_answer(j, "root", cs, nc, (uint32_t)j->rank, p, 8 + (size_t)n, mac);
    rc = -1;
    if (!same_mac(mac, p + 8 + n)) {
        snprintf(err, errlen, "the process at %s:%d (%s) is not this job's rank 0: it did not prove the job token",
                 j->addr, j->port, j->port_name);
    } else if (status == ST_SERVED && n == len) {
        memcpy(blob, p + 8, len);
        rc = 0;
    } else if (status == ST_DIFFER) {
        rc = fetch_differ(j, fd, cs, nc, p + 8, n, err, errlen);
    } else if (status == ST_TWICE) {
        snprintf(err, errlen, "rank 0 has served a rank %d already: two processes of this job were started as "
                 "rank %d", j->rank, j->rank);
        rc = RDZV_MISMATCH;
    } else if (status == ST_NOT_RANK) {
        snprintf(err, errlen, "rank 0 serves ranks 1 to %d, not rank %d", n == 4 ? (int)load_be32(p + 8) - 1 : 0,
                 j->rank);
        rc = RDZV_MISMATCH;
    } else {
        snprintf(err, errlen, "rank 0 answered status %u with %u bytes, not the %zu expected", status, n, len);
    }
done:
    free(p);
    return rc;
}

/* keep: where the connection to rank 0 is left open once served (NULL: closed). */
static int fetch(const RdzvJob *j, void *blob, size_t len, int *keep, char *err, size_t errlen) {
    char port[16], why[160] = "no answer";
    snprintf(port, sizeof port, "%d", j->port);
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai = NULL;
    double deadline = now_s() + j->timeout_s;
    for (;;) {
        int rc = getaddrinfo(j->addr, port, &hints, &ai);
        if (rc != 0) {
            snprintf(why, sizeof why, "%s", gai_strerror(rc));
        } else {
            double t = now_s() + CONNECT_S;
            int fd = connect_by(ai, t < deadline ? t : deadline);
            freeaddrinfo(ai);
            if (fd < 0) {
                snprintf(why, sizeof why, "%s", strerror(errno));
            } else {
                rc = fetch_once(j, fd, blob, len, why, sizeof why, err, errlen);
                if (rc == 0 && keep) *keep = fd;
                else close(fd);
                if (rc <= 0) return rc;
            }
        }
        if (now_s() > deadline) {
            snprintf(err, errlen, "rank %d cannot reach rank 0 at %s:%d (MASTER_ADDR:%s) within %g s: %s", j->rank,
                     j->addr, j->port, j->port_name, j->timeout_s, why);
            return -1;
        }
        nanosleep(&(struct timespec){ 0, RETRY_NS }, NULL);
    }
}

int rdzv_bcast(const RdzvJob *j, void *blob, size_t len, char *err, size_t errlen) {
    return j->rank == 0 ? serve(j, blob, len, NULL, err, errlen) : fetch(j, blob, len, NULL, err, errlen);
}

/* ---- holding on ------------------------------------------------------------------------- */

int rdzv_bcast_hold(const RdzvJob *j, void *blob, size_t len, RdzvHold *h, char *err, size_t errlen) {
    int W = j->world_size, n = j->rank == 0 ? W : 1, rc;
    memset(h, 0, sizeof *h);
    h->rank = j->rank;
    h->world = W;
    h->fd = malloc((size_t)n * sizeof *h->fd);
    h->mark = calloc((size_t)n, 1);
    h->gone = calloc((size_t)n, 1);
    if (!h->fd || !h->mark || !h->gone) {
        rdzv_release(h);
        snprintf(err, errlen, "out of memory for the rendezvous");
        return -1;
    }
    for (int r = 0; r < n; r++) h->fd[r] = -1;
    /* rank 0 holds a descriptor a rank: raise its limit as far as allowed,
     * and hold nothing (the connections close as served) where that is not
     * far enough */
    struct rlimit lim;
    rlim_t need = (rlim_t)W + MAX_CONN + 256;
    int hold = j->rank != 0 || (getrlimit(RLIMIT_NOFILE, &lim) == 0 && (lim.rlim_cur >= need ||
               (lim.rlim_max >= need && (lim.rlim_cur = need, setrlimit(RLIMIT_NOFILE, &lim) == 0))));
    rc = j->rank == 0 ? serve(j, blob, len, hold ? h->fd : NULL, err, errlen) : fetch(j, blob, len, h->fd, err, errlen);
    if (rc) rdzv_release(h);
    return rc;
}

void rdzv_mark(RdzvHold *h, int m) {
    unsigned char b = (unsigned char)m;
    if (h->fd && h->rank != 0 && h->fd[0] >= 0) (void)!send(h->fd[0], &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

int rdzv_poll(RdzvHold *h, int want) {
    if (!h->fd) return -1;
    int n = h->rank == 0 ? h->world : 1;
    for (int r = 0; r < n; r++) {
        unsigned char buf[64];
        ssize_t k = -1;
        while (h->fd[r] >= 0 && (k = recv(h->fd[r], buf, sizeof buf, MSG_DONTWAIT)) != 0) {
            if (k < 0) {
                if (errno == EINTR) continue;
                if (errno == EAGAIN) break;
                k = 0;   /* reset: as gone */
                break;
            }
            for (ssize_t i = 0; i < k; i++) if (buf[i] > h->mark[r]) h->mark[r] = buf[i];
        }
        if (h->fd[r] >= 0 && k == 0) {   /* closed */
            close(h->fd[r]);
            h->fd[r] = -1;
            h->gone[r] = 1;
        }
    }
    for (int r = 0; r < n; r++)
        if (h->gone[r] && (h->rank != 0 || h->mark[r] < want)) return h->rank == 0 ? r : 0;
    return -1;
}

/* A rank rank 0 holds (or held: its connection closed since) whose last mark is below want. */
static int below(const RdzvHold *h, int r, int want) { return (h->fd[r] >= 0 || h->gone[r]) && h->mark[r] < want; }

int rdzv_all_marked(const RdzvHold *h, int want) {
    for (int r = 1; h->fd && r < h->world; r++)
        if (below(h, r, want)) return 0;
    return 1;
}

void rdzv_missing(const RdzvHold *h, int want, const char *const *mark_names, char *buf, size_t len) {
    size_t k = 0;
    int n = 0;
    buf[0] = 0;
    for (int r = 1; h->fd && r < h->world && k + 48 < len; r++)
        if (below(h, r, want))
            k += (size_t)snprintf(buf + k, len - k, "%srank %d (%s)", n++ ? ", " : "", r,
                                  h->gone[r] ? "gone" : mark_names[h->mark[r]]);
}

void rdzv_release(RdzvHold *h) {
    int n = h->rank == 0 ? h->world : 1;
    for (int r = 0; h->fd && r < n; r++)
        if (h->fd[r] >= 0) close(h->fd[r]);
    free(h->fd);
    free(h->mark);
    free(h->gone);
    memset(h, 0, sizeof *h);
}
