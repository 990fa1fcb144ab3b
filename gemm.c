/* gemm.c: the CPU's matrix product, as BLIS builds one (the driver, the
 * packing, the threads, the plain kernel and the plain-loop specification).
 *
 * C[M,N] (+)= A[M,K] B[K,N] in five loops around a micro-kernel (Van Zee
 * and van de Geijn, "BLIS: A Framework for Rapidly Instantiating BLAS
 * Functionality", 2015):
 *
 *   for jc over N in steps of nc          B's panel: kc x nc, packed, in L3
 *     for pc over K in steps of kc        the K block: fixed by the kernel
 *       pack B[pc:pc+kc, jc:jc+nc] into nr-wide micro-panels
 *       for ic over M in steps of mc      A's block: mc x kc, packed, in L2
 *         pack A[ic:ic+mc, pc:pc+kc] into mr-tall micro-panels
 *         for jr over nc in steps of nr   a micro-panel of B stays in L1
 *           for ir over mc in steps of mr
 *             micro-kernel: C[mr x nr] += Ap[mr x kc] Bp[kc x nr]
 *
 * Packing makes every operand contiguous in the order the micro-kernel
 * reads it, whatever its strides: X W^T, dY W, dY^T X and attention's
 * strided heads are all the same loops. Edges are padded with zeros in the
 * packed panels, and a partial block of C goes through a small buffer, so
 * the micro-kernel (and its arithmetic) is the same for every element.
 *
 * Threads split the output, never K. Split by rows, the team packs each
 * panel of B together (each thread a share of its micro-panels, then a
 * barrier), and the threads take chunks of rows as they come (a guided
 * schedule: the chunks shrink as the panel's rows run out), each packing
 * its own rows of A. Split by columns, the roles swap: A packed together,
 * each thread its own B; where A is small the team packs all of it once,
 * and the threads then take chunks of columns as they come (guided too),
 * else each has one range of columns. Nothing is
 * packed twice and no two threads write the same element (a forward's bias
 * included: each member writes it into its own part of C before its first
 * K block). A product one thread runs (attention's, each inside attention's
 * own parallel region) opens no region and waits at no barrier.
 * gemm() takes the split that balances the threads' blocks, and between
 * near-equals the one whose shared operand is the smaller (GPT-2's products
 * of 256 rows split by columns: 43 row blocks of 6 do not halve, and A is
 * the smaller). Each element is summed over the same K blocks in the same
 * order by the same kernel whichever thread has it, so the result is the
 * same bits for 1, 2 or 3 threads, and for either split.
 *
 * The kernel is chosen once, on the first call: TRAIN_GEMM if set, else
 * AVX-512, else AVX2 with FMA (__builtin_cpu_supports), else the plain C
 * kernel below. That pointer, set once under pthread_once, is this file's
 * only state.
 */
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gemm.h"
#include "gemm_kernel.h"

/* ---------------------------------------------------------------------------
 * The specification: three loops, each element summed in k order. */

void gemm_reference(int M, int N, int K, const float *A, size_t a_rs, size_t a_cs,
                    const float *B, size_t b_rs, size_t b_cs, float *C, size_t ldc,
                    int accumulate, const float *bias) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < K; k++) s += A[i * a_rs + k * a_cs] * B[k * b_rs + j * b_cs];
            float *c = C + (size_t)i * ldc + j;
            *c = (accumulate ? *c : 0) + (bias ? bias[j] : 0) + s;
        }
}

/* ---------------------------------------------------------------------------
 * The plain kernel: 4 x 16 in C, vectorised by the compiler for whatever the
 * build targets (the fallback on a CPU with neither AVX2 nor AVX-512). */

#define PLAIN_MR 4
#define PLAIN_NR 16

static void plain_4x16(int kc, const float *Ap, const float *Bp, float *C, size_t ldc,
                       int load_c) {
    float acc[PLAIN_MR][PLAIN_NR] = {{0}};
    for (int k = 0; k < kc; k++, Ap += PLAIN_MR, Bp += PLAIN_NR)
        for (int i = 0; i < PLAIN_MR; i++)
            #pragma omp simd
            for (int j = 0; j < PLAIN_NR; j++) acc[i][j] += Ap[i] * Bp[j];
    for (int i = 0; i < PLAIN_MR; i++)
        for (int j = 0; j < PLAIN_NR; j++)
            C[i * ldc + j] = (load_c ? C[i * ldc + j] : 0) + acc[i][j];
}

/* The transposing pack in C: 8 k of each row at a time (one cache line read,
 * then written across the panel). */
static void plain_pack_t(int rows, int w, int kc, const float *src, size_t ld, int ahead, float *dst) {
    for (int k0 = 0; k0 < kc; k0 += 8) {
        int kn = kc - k0 < 8 ? kc - k0 : 8;
        for (int x = 0; x < rows; x++)
            for (int k = k0; k < k0 + kn; k++) dst[(size_t)k * w + x] = src[(size_t)x * ld + k];
    }
    for (int x = rows; x < w; x++)
        for (int k = 0; k < kc; k++) dst[(size_t)k * w + x] = 0;
}

/* a_outer 1: the plain kernel, which is not about speed, keeps the other loop
 * order of run_block tested */
static const GemmKernel plain_kernel = {"plain", PLAIN_MR, PLAIN_NR, 256, 128, 2048, 1, plain_4x16,
                                        plain_pack_t};

/* ---------------------------------------------------------------------------
 * Choosing the kernel, once. */

static const GemmKernel *chosen;  /* set once by gemm_choose, under pthread_once */
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

static int kernel_runs(const GemmKernel *k) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (!k->run) return 0;
#ifdef GEMM_AVX512_EMULATED  /* test/test_cpu_gemm_simde: gemm_avx512.c over SIMDe, on AVX2 */
    if (k == &gemm_avx512_kernel) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    if (k == &gemm_avx512_kernel) return __builtin_cpu_supports("avx512f");
    if (k == &gemm_avx2_kernel) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return 1;
#else
    return k->run != NULL && k == &plain_kernel;
#endif
}

static void gemm_choose(void) {
    const GemmKernel *all[] = {&gemm_avx512_kernel, &gemm_avx2_kernel, &plain_kernel};
    const char *want = getenv("TRAIN_GEMM");
    if (want && *want) {
        for (int i = 0; i < 3; i++)
            if (!strcmp(want, all[i]->name)) {
                if (kernel_runs(all[i])) { chosen = all[i]; return; }
                fprintf(stderr, "gemm: TRAIN_GEMM=%s: this CPU or build cannot run it; using the best it can\n", want);
                break;
            }
        if (!chosen && strcmp(want, "avx512") && strcmp(want, "avx2") && strcmp(want, "plain"))
            fprintf(stderr, "gemm: TRAIN_GEMM=%s: not avx512, avx2 or plain; using the best this CPU can\n", want);
    }
    for (int i = 0; i < 3; i++)
        if (kernel_runs(all[i])) { chosen = all[i]; return; }
}

static const GemmKernel *gemm_kernel(void) {
    pthread_once(&chosen_once, gemm_choose);
    return chosen;
}

const char *gemm_kernel_name(void) { return gemm_kernel()->name; }

void gemm_cpu_describe(char *model, size_t len, const char **isa) {
    snprintf(model, len, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        char *v = strchr(line, ':');
        if (!v) break;
        v += 1 + (v[1] == ' ');
        v[strcspn(v, "\n")] = 0;
        snprintf(model, len, "%s", v);
        break;
    }
    if (f) fclose(f);
    *isa = "none";
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (__builtin_cpu_supports("avx512f")) *isa = "AVX-512";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) *isa = "AVX2+FMA";
#endif
}

/* ---------------------------------------------------------------------------
 * Packing. */

/* d[0:w] = s[0:w], a panel's row: the kernels' widths as constants, so
 * that each is a few vector moves. */
static inline void copy_row(float *restrict d, const float *restrict s, int w) {
    switch (w) {
    case 4: for (int x = 0; x < 4; x++) d[x] = s[x]; break;
    case 6: for (int x = 0; x < 6; x++) d[x] = s[x]; break;
    case 12: for (int x = 0; x < 12; x++) d[x] = s[x]; break;
    case 16: for (int x = 0; x < 16; x++) d[x] = s[x]; break;
    case 32: for (int x = 0; x < 32; x++) d[x] = s[x]; break;
    default: for (int x = 0; x < w; x++) d[x] = s[x];
    }
}

/* dst <- an operand's n x kc block as micro-panels w wide, k-major: element
 * (x, k), at src[x * sx + k * sk], goes to panel x / w at [k * w + x % w];
 * x past n is zero. A is packed with (x = i, sx = rs, sk = cs, w = mr), B
 * with (x = j, sx = cs, sk = rs, w = nr): one routine for both. */
static void pack_panels(const GemmKernel *kn, int n, int kc, const float *src, size_t sx,
                        size_t sk, int w, float *dst) {
    int full = sx == 1 ? n / w * w : 0;
    /* x contiguous (dY^T as A; dY, W and X as B): a row of storage feeds 16
     * panels in one sweep (a panel alone would read one short run a page),
     * the row 8 ahead asked for meanwhile: each run is 16 panels wide (a KB
     * or two) and the rows are far apart, too short a stream for the
     * hardware's prefetcher to find (1.7-3.5% over a step's products on
     * the Zen 3, in-process A/B; 4 rows ahead 0.4-1.9%) */
    for (int x0 = 0; x0 < full; x0 += 16 * w) {
        int x1 = x0 + 16 * w < full ? x0 + 16 * w : full;
        for (int k = 0; k < kc; k++) {
            if (k + 8 < kc)
                for (int x = x0; x < x1; x += 16) __builtin_prefetch(src + x + (size_t)(k + 8) * sk);
            for (int p = x0; p < x1; p += w)
                copy_row(dst + (size_t)p * kc + (size_t)k * w, src + p + k * sk, w);
        }
    }
    dst += (size_t)full * kc;
    for (int x0 = full; x0 < n; x0 += w, dst += (size_t)w * kc) {
        int rows = n - x0 < w ? n - x0 : w;
        const float *s = src + (size_t)x0 * sx;
        if (sk == 1) { kn->pack_t(rows, w, kc, s, sx, n - x0 - rows, dst); continue; }  /* k contiguous: a transpose */
        for (int k = 0; k < kc; k++)
            for (int x = 0; x < w; x++) dst[(size_t)k * w + x] = x < rows ? s[x * sx + k * sk] : 0;
    }
}

/* ---------------------------------------------------------------------------
 * The five loops, shared by a team. */

typedef struct {
    int M, N, K;
    const float *A, *B;
    size_t a_rs, a_cs, b_rs, b_cs, ldc;
    float *C;
    int accumulate;     /* C holds what the product adds to */
    const float *bias;  /* [N] or NULL: added to C (or 0) before the product */
} GemmJob;

/* C[i0:i1, j0:j1] <- (C or 0) + bias, by the member that owns that part,
 * before its first K block; the kernel then adds to C (from_c). */
static void start_c(const GemmJob *g, int i0, int i1, int j0, int j1) {
    if (!g->bias) return;
    for (int i = i0; i < i1; i++) {
        float *c = g->C + (size_t)i * g->ldc;
        for (int j = j0; j < j1; j++) c[j] = (g->accumulate ? c[j] : 0) + g->bias[j];
    }
}

/* The first K block adds to what C holds (else it overwrites C). */
static int from_c(const GemmJob *g) { return g->accumulate || g->bias; }

/* How a team of nt threads divides C, and the one buffer it packs into. */
typedef struct {
    int nt;            /* threads that take part: at most the team's size and the blocks */
    int how;           /* GEMM_BY_ROWS, GEMM_BY_COLS_WHOLE or GEMM_BY_COLS_BLOCKS (below) */
    int chunk;         /* by rows, or by columns with A whole: the widest chunk a member takes */
    int next;          /* there: the first row or column no member has taken yet (take_chunk) */
    int blocks, unit;  /* by columns, A a block at a time: micro-blocks of N, and their size (nr) */
    int jblocks;       /* by columns, A a block at a time: blocks of nc columns each thread walks */
    size_t shared_floats, own, edge_floats;  /* the buffer's parts (below) */
    float *mem;        /* [shared block] then nt x [own block, edge tile] */
} GemmPlan;

enum { GEMM_BY_ROWS, GEMM_BY_COLS_WHOLE, GEMM_BY_COLS_BLOCKS };

/* Rounded up to a multiple of m. */
static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* C[ic:ic+mc, jc:jc+nc] (+)= A's packed mc x kc block at ap times B's packed
 * kc x nc block at bp, micro-block by micro-block (run_tile: the one at rows
 * ir, columns jr of the block); a partial block goes through the [mr*nr]
 * edge tile, with the same arithmetic. */
static void run_tile(const GemmKernel *kn, const GemmJob *g, const float *ap, const float *bp, int ic, int mc,
                     int jc, int nc, int kc, int load_c, float *edge, int ir, int jr) {
    const int mr = kn->mr, nr = kn->nr;
    const float *a = ap + (size_t)ir * kc, *b = bp + (size_t)jr * kc;
    int rows = mc - ir < mr ? mc - ir : mr, cols = nc - jr < nr ? nc - jr : nr;
    float *c = g->C + (size_t)(ic + ir) * g->ldc + jc + jr;
    if (rows == mr && cols == nr) { kn->run(kc, a, b, c, g->ldc, load_c); return; }
    for (int i = 0; i < rows; i++)
        if (load_c) memcpy(edge + i * nr, c + i * g->ldc, cols * sizeof(float));
    kn->run(kc, a, b, edge, nr, load_c);
    for (int i = 0; i < rows; i++) memcpy(c + i * g->ldc, edge + i * nr, cols * sizeof(float));
}

static void run_block(const GemmKernel *kn, const GemmJob *g, const float *ap, const float *bp, int ic, int mc,
                      int jc, int nc, int kc, int load_c, float *edge) {
    if (kn->a_outer)  /* an A micro-panel in L1, B's from L2 */
        for (int ir = 0; ir < mc; ir += kn->mr)
            for (int jr = 0; jr < nc; jr += kn->nr) run_tile(kn, g, ap, bp, ic, mc, jc, nc, kc, load_c, edge, ir, jr);
    else              /* a B micro-panel in L1, A's from L2 */
        for (int jr = 0; jr < nc; jr += kn->nr)
            for (int ir = 0; ir < mc; ir += kn->mr) run_tile(kn, g, ap, bp, ic, mc, jc, nc, kc, load_c, edge, ir, jr);
}

/* Member t's share (of nt) of the micro-panels of an operand's n x kc block,
 * packed: the operand is A (w = mr) or B (w = nr), its element (x, k) at
 * src[x * sx + k * sk]; the share, panels [q0, q1), goes to dst + q0 * w * kc. */
static void pack_share(const GemmKernel *kn, int n, int kc, const float *src, size_t sx, size_t sk, int w,
                       float *dst, int t, int nt) {
    int panels = (n + w - 1) / w, q0 = panels * t / nt, q1 = panels * (t + 1) / nt;
    if (q0 >= q1) return;
    int len = (q1 * w < n ? q1 * w : n) - q0 * w;
    pack_panels(kn, len, kc, src + (size_t)q0 * w * sx, sx, sk, w, dst + (size_t)q0 * w * kc);
}

/* The team's barrier; a team of one (a product called inside another
 * parallel region, attention's, or too small to split) has none to wait
 * at, and opens no OpenMP region at all (gemm_split). */
static inline void team_wait(int nt) {
    if (nt > 1) {
        #pragma omp barrier
    }
}

/* Chunks of rows (gemm_rows) or of columns (gemm_cols_whole) as the threads
 * take them: the first a guided schedule hands out is what is left over
 * twice the team, then each the rest over twice the team, down to
 * GEMM_CHUNK_MIN micro-panels, none wider than the plan's chunk; a thread
 * alone takes the plan's chunk at a time. The chunks shrink as the product
 * ends, so the members finish within a small chunk of each other.
 * Measured (in-process A/B, Zen 3, 2 threads): fixed chunks of columns,
 * about 2 a thread, were 1.02-1.03 over a step's products at 256 rows and
 * 1.05 at 1024 against fixed halves (mean times); 4 and 8 a thread no
 * better. */
#ifndef GEMM_CHUNK_MIN
#define GEMM_CHUNK_MIN 2
#endif

/* The widest chunk of columns, which the plan's buffer holds: the first. */
static int chunk_of(int len, int unit, int cap, int nt) {
    int units = (len + unit - 1) / unit, most = cap / unit > 1 ? cap / unit : 1;
    int per = nt > 1 ? (units + 2 * nt - 1) / (2 * nt) : most;
    if (per < GEMM_CHUNK_MIN) per = GEMM_CHUNK_MIN;
    if (per > most) per = most;
    return per * unit;
}

/* The next chunk of n rows or columns, in micro-panels of unit: its first,
 * and its width in *len; -1 when none is left. */
static int take_chunk(GemmPlan *p, int n, int unit, int *len) {
    int j = __atomic_load_n(&p->next, __ATOMIC_RELAXED);
    for (;;) {
        if (j >= n) return -1;
        int w = p->nt > 1 ? (int)round_up((size_t)(n - j + 2 * p->nt - 1) / (2 * p->nt), unit) : p->chunk;
        if (w < GEMM_CHUNK_MIN * unit) w = GEMM_CHUNK_MIN * unit;
        if (w > p->chunk) w = p->chunk;
        if (w > n - j) w = n - j;
        if (__atomic_compare_exchange_n(&p->next, &j, j + w, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            *len = w;
            return j;
        }
    }
}

/* Split by rows: for each kc x nc block of B the team packs it together and
 * waits at a barrier before any reads it; then each member takes the next
 * chunk of rows not yet taken (take_chunk), packs them mc at a time and runs
 * them against the block, and the team waits again before the next block
 * overwrites it. */
static void gemm_rows(const GemmKernel *kn, const GemmJob *g, GemmPlan *p, float *Ap, float *Bp, float *edge,
                      int t) {
    const int mr = kn->mr;
    for (int jc = 0; jc < g->N; jc += kn->nc) {
        int nc = g->N - jc < kn->nc ? g->N - jc : kn->nc;
        for (int pc = 0; pc < g->K; pc += kn->kc) {
            int kc = g->K - pc < kn->kc ? g->K - pc : kn->kc, load_c = pc > 0 || from_c(g);
            if (t == 0) __atomic_store_n(&p->next, 0, __ATOMIC_RELAXED);  /* all took their last before the barrier */
            pack_share(kn, nc, kc, g->B + pc * g->b_rs + (size_t)jc * g->b_cs, g->b_cs, g->b_rs, kn->nr, Bp, t,
                       p->nt);
            team_wait(p->nt);
            for (int i0, rows; (i0 = take_chunk(p, g->M, mr, &rows)) >= 0;) {
                /* the chunk's rows in blocks of at most mc, as equal as they go */
                const int panels = (rows + mr - 1) / mr, mblocks = (rows + kn->mc - 1) / kn->mc;
                const int mc_step = (panels + mblocks - 1) / mblocks * mr, i1 = i0 + rows;
                if (pc == 0) start_c(g, i0, i1, jc, jc + nc);
                for (int ic = i0; ic < i1; ic += mc_step) {
                    int mc = i1 - ic < mc_step ? i1 - ic : mc_step;
                    pack_panels(kn, mc, kc, g->A + (size_t)ic * g->a_rs + pc * g->a_cs, g->a_rs, g->a_cs, mr, Ap);
                    run_block(kn, g, Ap, Bp, ic, mc, jc, nc, kc, load_c, edge);
                }
            }
            team_wait(p->nt);
        }
    }
}

/* Columns [jc, jc + nc) of gemm_cols_whole's: B's columns packed K block by
 * K block and run against all of packed A (mpad rows), mc_step rows a block. */
static void cols_chunk(const GemmKernel *kn, const GemmJob *g, const float *Ap, float *Bp, float *edge, int mpad,
                       int mc_step, int jc, int nc) {
    start_c(g, 0, g->M, jc, jc + nc);
    for (int pc = 0; pc < g->K; pc += kn->kc) {
        int kc = g->K - pc < kn->kc ? g->K - pc : kn->kc, load_c = pc > 0 || from_c(g);
        pack_panels(kn, nc, kc, g->B + pc * g->b_rs + (size_t)jc * g->b_cs, g->b_cs, g->b_rs, kn->nr, Bp);
        for (int ic = 0; ic < g->M; ic += mc_step) {
            int mc = g->M - ic < mc_step ? g->M - ic : mc_step;
            run_block(kn, g, Ap + (size_t)mpad * pc + (size_t)ic * kc, Bp, ic, mc, jc, nc, kc, load_c, edge);
        }
    }
}

/* Split by columns, A small (GEMM_A_WHOLE_BYTES): the team packs all of A
 * once, every K block of it (K block pc at Ap + mpad * pc), then each member
 * takes the next chunk of columns not yet taken (take_chunk), and packs and
 * runs it K block by K block against A in blocks of mc rows. Chunks as they
 * come, not a fixed share each: after the one barrier the threads run
 * apart, and on a shared VM one core can run at half speed for
 * milliseconds; with fixed halves the other then sat idle, 4-25% of a
 * forward product's thread time (Zen 3, 2 threads). */
static void gemm_cols_whole(const GemmKernel *kn, const GemmJob *g, GemmPlan *p, float *Ap, float *Bp,
                            float *edge, int t) {
    const int mr = kn->mr, mpad = (int)round_up(g->M, mr);
    /* A's rows in blocks of at most mc, of whole micro-panels, as equal as
     * they go: 256 rows at mc 240 and mr 12 are two blocks of 132, not 240
     * and 16 (a block of 16 would read each B micro-panel for two calls) */
    const int mblocks = (g->M + kn->mc - 1) / kn->mc, panels = mpad / mr;
    const int mc_step = (panels + mblocks - 1) / mblocks * mr;
    for (int pc = 0; pc < g->K; pc += kn->kc) {
        int kc = g->K - pc < kn->kc ? g->K - pc : kn->kc;
        pack_share(kn, g->M, kc, g->A + pc * g->a_cs, g->a_rs, g->a_cs, mr, Ap + (size_t)mpad * pc, t, p->nt);
    }
    team_wait(p->nt);
    for (int jc, nc; (jc = take_chunk(p, g->N, kn->nr, &nc)) >= 0;)
        cols_chunk(kn, g, Ap, Bp, edge, mpad, mc_step, jc, nc);
}

/* Split by columns, A too large to pack whole (the head's dX: dY is 256 x
 * 50304): each member has one contiguous range of columns [j0, j1), walked in
 * jblocks blocks of nc (the same count for every member, some perhaps with no
 * columns left in the last ones); for each mc x kc block of A the team packs
 * it together, waits at a barrier before any reads it and again before the
 * next one overwrites it, and each member packs its own B. */
static void gemm_cols_blocks(const GemmKernel *kn, const GemmJob *g, const GemmPlan *p, int j0, int j1,
                             float *Ap, float *Bp, float *edge, int t) {
    start_c(g, 0, g->M, j0, j1);
    for (int jb = 0; jb < p->jblocks; jb++) {
        int jc = j0 + jb * kn->nc, nc = j1 - jc < kn->nc ? j1 - jc : kn->nc;
        if (nc < 0) nc = 0;  /* a member past its columns still packs its share of A */
        for (int pc = 0; pc < g->K; pc += kn->kc) {
            int kc = g->K - pc < kn->kc ? g->K - pc : kn->kc, load_c = pc > 0 || from_c(g);
            if (nc > 0)
                pack_panels(kn, nc, kc, g->B + pc * g->b_rs + (size_t)jc * g->b_cs, g->b_cs, g->b_rs, kn->nr, Bp);
            for (int ic = 0; ic < g->M; ic += kn->mc) {
                int mc = g->M - ic < kn->mc ? g->M - ic : kn->mc;
                pack_share(kn, mc, kc, g->A + (size_t)ic * g->a_rs + pc * g->a_cs, g->a_rs, g->a_cs, kn->mr, Ap,
                           t, p->nt);
                team_wait(p->nt);
                run_block(kn, g, Ap, Bp, ic, mc, jc, nc, kc, load_c, edge);
                team_wait(p->nt);
            }
        }
    }
}

/* The most bytes of A packed whole (gemm_plan): 4 MB, GPT-2 124M's forward
 * up to 1365 rows (K 768). */
#ifndef GEMM_A_WHOLE_BYTES
#define GEMM_A_WHOLE_BYTES (4u << 20)
#endif

static void gemm_plan(const GemmKernel *kn, GemmSplit split, int M, int N, int K, int nt, GemmPlan *p) {
    /* The rows split, one packed B shared by the team (BLIS's ic loop in
     * parallel), or the columns, one packed A shared (its jr loop in
     * parallel). AUTO: the split that leaves the busiest thread fewer
     * micro-blocks, when the other leaves it 1/16 more; between near-equals,
     * the one whose shared operand is the smaller (by columns when M < N):
     * each thread then streams its own larger operand against all of the
     * other's micro-panels, and less crosses between cores. A few rows
     * (sampling) split the columns. Measured on a Zen 3, 2 threads,
     * in-process A/B over GPT-2's products (with fixed halves, before the
     * dynamic chunks): at 256 rows (43 blocks of 6 do not halve; N >= 768)
     * the columns 4-8% faster over a step; at 264 rows (a tie) still 5%, up
     * to 20% on the forward, while the dW products with M >= N were 3-8%
     * slower so; at 1024 rows this rule 1% faster than balance alone. */
    int mblocks = (M + kn->mr - 1) / kn->mr, nblocks = (N + kn->nr - 1) / kn->nr;
    long by_rows = (long)((mblocks + nt - 1) / nt) * nblocks, by_cols = (long)((nblocks + nt - 1) / nt) * mblocks;
    int split_m = split == GEMM_SPLIT_ROWS;
    if (split == GEMM_SPLIT_AUTO)  /* balance first; between near-equals, share the smaller operand */
        split_m = 16 * by_cols > 17 * by_rows ? 1 : 16 * by_rows > 17 * by_cols ? 0 : M >= N;
    size_t whole = round_up(round_up(M, kn->mr) * (size_t)K, 16);
    int how = split_m ? GEMM_BY_ROWS
              : split != GEMM_SPLIT_COLS_BLOCKS && whole * sizeof(float) <= GEMM_A_WHOLE_BYTES ? GEMM_BY_COLS_WHOLE
              : GEMM_BY_COLS_BLOCKS;
    int kc = kn->kc < K ? kn->kc : K;
    int blocks = split_m ? mblocks : nblocks;
    if (nt > blocks) nt = blocks;
    *p = (GemmPlan){nt, how, 0, 0, nblocks, kn->nr, 1, 0, 0, round_up((size_t)kn->mr * kn->nr, 16), NULL};
    /* one buffer: the shared operand's block, then each thread's own block
     * and edge tile, 64-byte aligned parts; whole micro-panels (an mc or nc
     * tried with -DAVX2_MC=... need not be a multiple of mr or nr) */
    if (how == GEMM_BY_ROWS) {
        p->chunk = (int)round_up(M, kn->mr);  /* no wider than all of them */
        p->shared_floats = round_up(round_up(kn->nc < N ? kn->nc : N, kn->nr) * kc, 16);
        p->own = round_up(round_up(kn->mc < M ? kn->mc : M, kn->mr) * kc, 16);
    } else if (how == GEMM_BY_COLS_WHOLE) {
        p->chunk = chunk_of(N, kn->nr, kn->nc, nt);
        p->shared_floats = whole;
        p->own = round_up(round_up(p->chunk, kn->nr) * kc, 16);
    } else {
        int most = (nblocks + nt - 1) / nt * kn->nr;  /* a thread's columns, at most */
        int nc = kn->nc < most ? kn->nc : most, mc = kn->mc < M ? kn->mc : M;
        p->jblocks = (most + kn->nc - 1) / kn->nc;
        p->shared_floats = round_up(round_up(mc, kn->mr) * kc, 16);
        p->own = round_up(round_up(nc, kn->nr) * kc, 16);
    }
    p->own += p->edge_floats;
    size_t floats = p->shared_floats + nt * p->own;
    if (posix_memalign((void **)&p->mem, 64, floats * sizeof(float))) {
        fprintf(stderr, "error: out of host memory (gemm buffers, %zu floats)\n", floats);
        exit(1);
    }
}

/* Member t's part of the product: its own packing buffer and edge tile
 * from the plan's one buffer, then the split's loops (chunks taken as they
 * come, or with A a block at a time, one fixed range of columns). */
static void gemm_member(const GemmKernel *kn, const GemmJob *g, GemmPlan *p, int t) {
    float *shared = p->mem, *mine = shared + p->shared_floats + t * p->own;  /* [own block] then [edge] */
    float *edge = mine + p->own - p->edge_floats;                            /* [mr*nr] */
    if (p->how == GEMM_BY_ROWS) { gemm_rows(kn, g, p, mine, shared, edge, t); return; }
    if (p->how == GEMM_BY_COLS_WHOLE) { gemm_cols_whole(kn, g, p, shared, mine, edge, t); return; }
    int lo = p->blocks * t / p->nt * p->unit, hi = p->blocks * (t + 1) / p->nt * p->unit;
    gemm_cols_blocks(kn, g, p, lo, hi < g->N ? hi : g->N, shared, mine, edge, t);
}

void gemm(int M, int N, int K, const float *A, size_t a_rs, size_t a_cs, const float *B,
          size_t b_rs, size_t b_cs, float *C, size_t ldc, int accumulate, const float *bias) {
    gemm_split(GEMM_SPLIT_AUTO, M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate, bias);
}

void gemm_split(GemmSplit split, int M, int N, int K, const float *A, size_t a_rs, size_t a_cs,
                const float *B, size_t b_rs, size_t b_cs, float *C, size_t ldc, int accumulate,
                const float *bias) {
    if (M <= 0 || N <= 0) return;
    const GemmKernel *kn = gemm_kernel();
    if (K <= 0) {  /* no product: C is (C or 0) + bias */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                C[(size_t)i * ldc + j] = (accumulate ? C[(size_t)i * ldc + j] : 0) + (bias ? bias[j] : 0);
        return;
    }
    GemmJob g = {M, N, K, A, B, a_rs, a_cs, b_rs, b_cs, ldc, C, accumulate, bias};
    GemmPlan p;
    gemm_plan(kn, split, M, N, K, omp_in_parallel() ? 1 : omp_get_max_threads(), &p);
    const int asked = p.nt;
    if (asked == 1) {  /* no region to open (inside attention's, a product too small to split) */
        gemm_member(kn, &g, &p, 0);
        free(p.mem);
        return;
    }
    #pragma omp parallel num_threads(asked)
    {
        if (omp_get_num_threads() != asked) {  /* fewer than asked (OMP_THREAD_LIMIT, OMP_DYNAMIC) */
            #pragma omp single
            {
                free(p.mem);
                gemm_plan(kn, split, M, N, K, omp_get_num_threads(), &p);
            }  /* (a barrier: every thread sees the new plan) */
        }
        gemm_member(kn, &g, &p, omp_get_thread_num());
    }
    free(p.mem);
}
