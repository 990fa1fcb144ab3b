/* test/test_rdzv.c: rendezvous.c's SHA-256 and HMAC-SHA256 against published
 * test vectors (FIPS 180-4's examples, RFC 4231's cases), its token
 * derivation, and the clients test/test_rendezvous.sh sets on a job's rank 0:
 *
 *   test/test_rdzv                          the vectors (PASS/FAIL lines)
 *   test/test_rdzv --free-port              a TCP port nobody listens on now
 *   test/test_rdzv --stranger H P R FILE    a client without the token, claiming rank R at H:P,
 *                                           twice: the old protocol (rank first), then a join
 *                                           with a made-up HMAC; every byte it got goes to FILE
 *   test/test_rdzv --silent H P N S         N clients that connect to H:P and say nothing for S s
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>
#include "rendezvous.h"

static int failed;

static void hex(const unsigned char *d, int n, char *out) {
    for (int i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static void expect(const char *name, const unsigned char *got, const char *want) {
    char h[65];
    hex(got, 32, h);
    int ok = !strcmp(h, want);
    failed += !ok;
    printf("%s %s: %s%s%s\n", ok ? "PASS" : "FAIL", name, h, ok ? "" : " want ", ok ? "" : want);
}

static void vectors(void) {
    unsigned char d[32], key[131], msg[64];
    /* FIPS 180-4's examples (NIST's "SHA256.pdf"), and the empty message */
    rdzv_sha256("abc", 3, d);
    expect("sha256 \"abc\" (one block)", d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    rdzv_sha256("", 0, d);
    expect("sha256 \"\"", d, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";   /* 448 bits: two blocks */
    rdzv_sha256(two, strlen(two), d);
    expect("sha256 448-bit message (two blocks)", d, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    RdzvSha256 s;   /* a million 'a', fed in uneven pieces: the block boundary at every offset */
    char a[997];
    memset(a, 'a', sizeof a);
    rdzv_sha256_init(&s);
    for (size_t left = 1000000, k = 1; left; k = k % 997 + 1) {
        size_t n = k < left ? k : left;
        rdzv_sha256_update(&s, a, n);
        left -= n;
    }
    rdzv_sha256_final(&s, d);
    expect("sha256 a million 'a' in pieces of 1..997 bytes", d,
           "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* RFC 4231, HMAC-SHA-256 test cases 1, 2, 3 and 6 (a key longer than a block) */
    memset(key, 0x0b, 20);
    rdzv_hmac(key, 20, "Hi There", 8, d);
    expect("hmac RFC 4231 case 1", d, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    rdzv_hmac("Jefe", 4, "what do ya want for nothing?", 28, d);
    expect("hmac RFC 4231 case 2", d, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(key, 0xaa, 20);
    memset(msg, 0xdd, 50);
    rdzv_hmac(key, 20, msg, 50, d);
    expect("hmac RFC 4231 case 3", d, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    memset(key, 0xaa, 131);
    const char *t6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    rdzv_hmac(key, 131, t6, strlen(t6), d);
    expect("hmac RFC 4231 case 6 (131-byte key)", d, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    /* the token: a function of both the secret and the identity */
    unsigned char t1[32], t2[32], t3[32], t4[32];
    rdzv_token_derive(NULL, "SLURM_JOB_ID=1 SLURM_STEP_ID=0", t1);
    rdzv_token_derive("", "SLURM_JOB_ID=1 SLURM_STEP_ID=0", t2);
    rdzv_token_derive(NULL, "SLURM_JOB_ID=2 SLURM_STEP_ID=0", t3);
    rdzv_token_derive("s3cret", "SLURM_JOB_ID=1 SLURM_STEP_ID=0", t4);
    int ok = !memcmp(t1, t2, 32) && memcmp(t1, t3, 32) && memcmp(t1, t4, 32);
    failed += !ok;
    printf("%s token: the same identity gives the same token, another job or a secret another one\n",
           ok ? "PASS" : "FAIL");
}

static int dial(const char *host, int port) {
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) return -1;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
    if (fd >= 0) close(fd);
    return -1;
}

/* Dials until it connects (20 s at most). */
static int dial_wait(const char *host, int port) {
    for (int i = 0; i < 400; i++) {
        int fd = dial(host, port);
        if (fd >= 0) return fd;
        nanosleep(&(struct timespec){ 0, 50000000L }, NULL);
    }
    return -1;
}

/* Everything fd sends until it closes or is quiet for 3 s, appended to f. */
static size_t drain(int fd, FILE *f) {
    char buf[4096];
    size_t total = 0;
    struct pollfd pf = { fd, POLLIN, 0 };
    while (poll(&pf, 1, 3000) == 1) {
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k <= 0) break;
        fwrite(buf, 1, (size_t)k, f);
        total += (size_t)k;
    }
    return total;
}

static int stranger(const char *host, int port, int rank, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); return 2; }
    int fd = dial_wait(host, port);   /* 1. the old protocol: the rank, then read what comes */
    if (fd < 0) { fprintf(stderr, "cannot connect to %s:%d\n", host, port); return 2; }
    int32_t r = rank;
    if (send(fd, &r, sizeof r, MSG_NOSIGNAL) != (ssize_t)sizeof r) perror("send");
    size_t a = drain(fd, f);
    close(fd);
    fd = dial_wait(host, port);       /* 2. this protocol's join, with an HMAC made up */
    if (fd < 0) { fprintf(stderr, "cannot connect to %s:%d again\n", host, port); return 2; }
    unsigned char join[100];
    for (size_t i = 0; i < sizeof join; i++) join[i] = (unsigned char)rand();
    join[0] = join[1] = join[2] = 0;
    join[3] = (unsigned char)rank;
    if (send(fd, join, sizeof join, MSG_NOSIGNAL) != (ssize_t)sizeof join) perror("send");
    size_t b = drain(fd, f);
    close(fd);
    fclose(f);
    printf("stranger: %zu bytes back on the old protocol, %zu on a join without the token\n", a, b);
    return 0;
}

static int silent(const char *host, int port, int n, double secs) {
    int fds[256];
    if (n > 256) n = 256;
    for (int i = 0; i < n; i++)
        if ((fds[i] = dial_wait(host, port)) < 0) { fprintf(stderr, "client %d cannot connect\n", i); return 2; }
    printf("silent: %d clients connected to %s:%d\n", n, host, port);
    fflush(stdout);
    nanosleep(&(struct timespec){ (time_t)secs, (long)((secs - (time_t)secs) * 1e9) }, NULL);
    for (int i = 0; i < n; i++) close(fds[i]);
    return 0;
}

static int free_port(void) {
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &al)) {
        perror("free port");
        return 2;
    }
    printf("%d\n", ntohs(a.sin_port));
    close(fd);
    return 0;
}

int main(int argc, char **argv) {
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    if (argc == 2 && !strcmp(argv[1], "--free-port")) return free_port();
    if (argc == 6 && !strcmp(argv[1], "--stranger")) return stranger(argv[2], atoi(argv[3]), atoi(argv[4]), argv[5]);
    if (argc == 6 && !strcmp(argv[1], "--silent")) return silent(argv[2], atoi(argv[3]), atoi(argv[4]), atof(argv[5]));
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--free-port | --stranger HOST PORT RANK FILE | --silent HOST PORT N SECONDS]\n",
                argv[0]);
        return 2;
    }
    vectors();
    printf("test_rdzv: %s\n", failed ? "FAILED" : "all vectors agree");
    return failed != 0;
}
