/* rendezvous.h: how rank 0 hands the other ranks of a job what they need to
 * join it (the shared segment's name, the NCCL id), over TCP, to those ranks
 * only (rendezvous.c has the protocol and the threat model; DESIGN.md,
 * "Processes"). A leaf: it calls the C library only, and both backends of
 * comm.h call it.
 *
 * The job token: 32 bytes that every rank of one job derives from the same
 * inputs (the launcher's job identity, a secret the user exports) and no
 * other job does. It never crosses the wire: a client proves it with an
 * HMAC of rank 0's fresh challenge, and rank 0 proves it back.
 *
 * The agreement: a list of "name=value" items every rank of the job must
 * have equal (world size, model, layout, data, version). A rank whose list
 * differs from rank 0's is told which item differs first, and both stop.
 */
#ifndef RENDEZVOUS_H
#define RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#define RDZV_TOKEN_BYTES 32
#define RDZV_DIGEST_BYTES 32
#define RDZV_MISMATCH (-2)       /* rdzv_bcast: the ranks disagree on an item (exit 2) */

/* ---- SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104) ------------------------ */

typedef struct RdzvSha256 {
    uint32_t h[8];               /* the running hash */
    uint64_t bytes;              /* message length so far */
    unsigned char block[64];     /* a partial block */
    size_t fill;                 /* bytes of it in use */
} RdzvSha256;

void rdzv_sha256_init(RdzvSha256 *s);
void rdzv_sha256_update(RdzvSha256 *s, const void *p, size_t n);
/* Pads, writes the 32-byte hash to out; s must be initialised again before reuse. */
void rdzv_sha256_final(RdzvSha256 *s, unsigned char out[32]);
/* out = SHA-256(p[n]). */
void rdzv_sha256(const void *p, size_t n, unsigned char out[32]);
/* out = HMAC-SHA256(key[klen], msg[n]); any key length (long keys are hashed first). */
void rdzv_hmac(const void *key, size_t klen, const void *msg, size_t n, unsigned char out[32]);

/* ---- the job token --------------------------------------------------------- */

/* token = HMAC-SHA256(secret, "train job\0" identity): the secret (NULL or
 * "" for none) and the launcher's job identity (NULL or "" for none) mixed,
 * so one secret reused by two jobs still gives two tokens. */
void rdzv_token_derive(const char *secret, const char *identity, unsigned char token[RDZV_TOKEN_BYTES]);
/* A token from the kernel's random source (getrandom). 0, or -1 with err. */
int rdzv_token_random(unsigned char token[RDZV_TOKEN_BYTES], char *err, size_t errlen);

/* ---- the hand-out ------------------------------------------------------------ */

/* One rank's view of the rendezvous. */
typedef struct RdzvJob {
    int rank, world_size;
    const char *addr;            /* rank 0's host (MASTER_ADDR): rank 0 binds it when it is one of
                                    this host's, else every address; "" or NULL: every address */
    int port;
    const char *port_name;       /* for messages: "MASTER_PORT" or "MASTER_PORT + 1" */
    const unsigned char *token;  /* [RDZV_TOKEN_BYTES] */
    const char *token_from;      /* for messages: what it was derived from ("TORCHELASTIC_RUN_ID") */
    const char *const *items;    /* [nitems] "name=value": what the ranks must agree on */
    int nitems;
    double timeout_s;            /* how long rank 0 waits for them all, and they for rank 0 */
} RdzvJob;

/* Rank 0 hands blob[len] to every other rank of j, serving them concurrently
 * (a silent or slow client costs nobody else any time); the others fetch it
 * into blob. A client is served once it has proven the token and its items'
 * digest equals rank 0's; a client without the token is turned away (rank 0
 * goes on waiting), a rank already served is not served again. Returns 0;
 * RDZV_MISMATCH with err naming the first item that differs (on rank 0 and
 * on the rank that differs); or -1 with err: the port cannot be bound, the
 * ranks named did not come within timeout_s, rank 0 was not reached (or
 * turned this rank away: another job's token), the process at the port is
 * not this job's rank 0. */
int rdzv_bcast(const RdzvJob *j, void *blob, size_t len, char *err, size_t errlen);

/* ---- holding on: who is still there ---------------------------------------------- */

/* After rdzv_bcast_hold, rank 0 keeps the connection of every rank it
 * served, and each of them its own to rank 0, until rdzv_release: through
 * them a rank tells rank 0 the marks it reaches (1, 2, ...: "about to join
 * NCCL", "joined"), and a process that dies closes its end, which the other
 * side sees at once. */
typedef struct RdzvHold {
    int rank, world;
    int *fd;                     /* rank 0: [world] each rank's connection (-1: none or closed);
                                    the others: fd[0], theirs to rank 0 */
    unsigned char *mark;         /* rank 0: [world] the last mark each rank sent */
    char *gone;                  /* rank 0: [world] 1 once its connection closed */
} RdzvHold;

/* rdzv_bcast, then h holds the connections (h zeroed and unused on error).
 * Rank 0 needs a descriptor a rank: it raises its soft limit (RLIMIT_NOFILE)
 * up to the hard one, and where that is not enough holds none (rdzv_poll
 * then sees no rank leave). */
int rdzv_bcast_hold(const RdzvJob *j, void *blob, size_t len, RdzvHold *h, char *err, size_t errlen);
/* A rank other than 0 tells rank 0 it reached mark m (1..255). */
void rdzv_mark(RdzvHold *h, int m);
/* Reads what came, without waiting. Rank 0: the first rank whose connection
 * closed before it sent mark `want`, or -1. The others: 0 when rank 0's
 * connection closed, else -1. */
int rdzv_poll(RdzvHold *h, int want);
/* Rank 0: whether every rank it holds (or held) has sent mark want. */
int rdzv_all_marked(const RdzvHold *h, int want);
/* Rank 0: "rank 2 (gone), rank 3 (at mark 1)": the ranks it holds below mark want. */
void rdzv_missing(const RdzvHold *h, int want, const char *const *mark_names, char *buf, size_t len);
/* Closes the connections and frees h. */
void rdzv_release(RdzvHold *h);

#endif
