/* test/emu/emu_rt.cpp: the runtime of the CPU emulation (emu.h): fibers and
 * their switch, the warp-greedy scheduler, barriers, the warp collectives'
 * arithmetic (ldmatrix, mma.sync, shuffles), cp.async landing, sm_90a's
 * mbarriers, TMA and wgmma, clusters (their CTAs run together: multicast
 * TMA, remote mbarrier arrivals, barrier.cluster, the exit rule), the grid
 * launch, and the CUDA runtime calls
 * the .cu files and comm.c's NCCL backend make (with the driver's
 * cuTensorMapEncodeTiled): devices, asynchronous streams with their
 * timings and race detector (emu_stream.h; see "Devices, streams, events
 * and memory" below for EMU_GPUS, EMU_STREAMS and EMU_RACECHECK, read once
 * per process), events and memory.
 *
 * Settings of the scheduler, read once per OS thread from the environment:
 *   EMU_CP=early|late   when cp.async and TMA land and wgmma runs (default early; see emu.h)
 *   EMU_ORDER=up|down   which warp runs first after a barrier (default up)
 *   EMU_ARCH=sm_80|sm_90a  the emulated device (default sm_80; sm_90a: an H100)
 *   EMU_SMS=n           its SM count (default 108, or 132 for sm_90a)
 */
#include "emu.h"
#include <stdarg.h>
#include <sys/mman.h>
#include <time.h>
#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

thread_local EmuBlock *emu_blk;

namespace {

/* ---------------------------------------------------------------------------
 * The fiber switch: save the callee-saved registers on the current stack,
 * store the stack pointer in *save, load `next` and pop its registers. A new
 * fiber's stack is laid out as if it had switched out just before entering
 * emu_fiber_start, which runs emu_fiber_main and never returns. */

extern "C" void emu_switch(void **save, void *next);
extern "C" void emu_fiber_start(void);
extern "C" void emu_fiber_main(void);

#if defined(__x86_64__)
#define EMU_ASM_SWITCH 1
/* pushed: rbp rbx r12 r13 r14 r15, then 8 bytes of mxcsr and x87 control word */
enum { EMU_SAVED_WORDS = 7 };
__asm__(
    ".text\n"
    ".globl emu_switch\n"
    ".type emu_switch,@function\n"
    "emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_switch, .-emu_switch\n"
    ".globl emu_fiber_start\n"
    ".type emu_fiber_start,@function\n"
    "emu_fiber_start:\n"
    "  call emu_fiber_main\n"
    "  ud2\n"
    ".size emu_fiber_start, .-emu_fiber_start\n");

/* The initial stack of a fiber: control words, six zero registers, then the
 * return address emu_fiber_start, in the word below a 16-byte boundary so
 * that the stack is 16-byte aligned at emu_fiber_start's call. */
void *emu_stack_init(char *stack, size_t size) {
    uintptr_t top = (uintptr_t)(stack + size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = (uint64_t)(uintptr_t)&emu_fiber_start;
    for (int i = 0; i < 6; i++) *--sp = 0;
    uint32_t mxcsr;
    uint16_t fcw;
    __asm__ volatile("stmxcsr %0\n fnstcw %1" : "=m"(mxcsr), "=m"(fcw));
    --sp;
    memcpy((char *)sp, &mxcsr, 4);
    memcpy((char *)sp + 4, &fcw, 2);
    return sp;
}
#elif defined(__aarch64__)
#define EMU_ASM_SWITCH 1
/* saved: x19..x30 (12) and d8..d15 (8), 160 bytes */
__asm__(
    ".text\n"
    ".globl emu_switch\n"
    ".type emu_switch,%function\n"
    "emu_switch:\n"
    "  sub sp, sp, #160\n"
    "  stp x19, x20, [sp, #0]\n  stp x21, x22, [sp, #16]\n  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n  stp x27, x28, [sp, #64]\n  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n  stp d10, d11, [sp, #112]\n  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n"
    "  mov x2, sp\n  str x2, [x0]\n  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n  ldp x21, x22, [sp, #16]\n  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n  ldp x27, x28, [sp, #64]\n  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n  ldp d10, d11, [sp, #112]\n  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #160\n"
    "  ret\n"
    ".size emu_switch, .-emu_switch\n"
    ".globl emu_fiber_start\n"
    ".type emu_fiber_start,%function\n"
    "emu_fiber_start:\n"
    "  bl emu_fiber_main\n"
    "  brk #0\n"
    ".size emu_fiber_start, .-emu_fiber_start\n");

void *emu_stack_init(char *stack, size_t size) {
    uintptr_t top = (uintptr_t)(stack + size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 160);
    memset(sp, 0, 160);
    sp[11] = (uint64_t)(uintptr_t)&emu_fiber_start;  /* x30: where ret goes */
    return sp;
}
#else
#define EMU_ASM_SWITCH 0
#endif

#if !EMU_ASM_SWITCH
#error "emu: no fiber switch for this architecture (x86-64 and AArch64 are written)"
#endif

/* ---------------------------------------------------------------------------
 * Per OS thread: the fiber stacks (reused by every block) and the settings. */

constexpr size_t EMU_STACK = 256 * 1024;
constexpr uint64_t EMU_CANARY = 0x454d55464942455dull;  /* the lowest word of each stack */
constexpr size_t EMU_SMEM_GUARD = 256;
constexpr size_t EMU_SMEM_DEFAULT = 48 * 1024, EMU_SMEM_MAX = 227 * 1024;

struct EmuThreadState {
    char *stacks = nullptr;
    int nstacks = 0;
    void *main_sp = nullptr;  /* the launching code, while a block runs */
    int cp_late = 0, order_down = 0, ready = 0;
    int sm90 = 0;  /* EMU_ARCH=sm_90a */
    int sms = 0;   /* EMU_SMS, or the architecture's count */
};
thread_local EmuThreadState emu_ts;

void emu_settings(void) {
    if (emu_ts.ready) return;
    const char *cp = getenv("EMU_CP"), *order = getenv("EMU_ORDER"), *arch = getenv("EMU_ARCH"),
               *sms = getenv("EMU_SMS");
    if (cp && strcmp(cp, "late") && strcmp(cp, "early")) emu_fail("EMU_CP must be early or late, not %s", cp);
    if (order && strcmp(order, "up") && strcmp(order, "down")) emu_fail("EMU_ORDER must be up or down, not %s", order);
    if (arch && strcmp(arch, "sm_80") && strcmp(arch, "sm_90a")) emu_fail("EMU_ARCH must be sm_80 or sm_90a, not %s", arch);
    emu_ts.cp_late = cp && !strcmp(cp, "late");
    emu_ts.order_down = order && !strcmp(order, "down");
    emu_ts.sm90 = arch && !strcmp(arch, "sm_90a");
    emu_ts.sms = emu_ts.sm90 ? 132 : 108;
    if (sms) {
        char *end;
        const long v = strtol(sms, &end, 10);
        if (*sms == '\0' || *end != '\0' || v < 1 || v > 1024) emu_fail("EMU_SMS must be a count of 1 to 1024, not %s", sms);
        emu_ts.sms = (int)v;
    }
    emu_ts.ready = 1;
}

char *emu_stack(int i) { return emu_ts.stacks + (size_t)i * EMU_STACK; }

void emu_ensure_stacks(int n) {
    if (n <= emu_ts.nstacks) return;
    if (emu_ts.stacks) munmap(emu_ts.stacks, (size_t)emu_ts.nstacks * EMU_STACK);
    void *p = mmap(nullptr, (size_t)n * EMU_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) emu_fail("cannot map %d fiber stacks", n);
    emu_ts.stacks = (char *)p;
    emu_ts.nstacks = n;
}

/* ---------------------------------------------------------------------------
 * Scheduling. */

/* From the running fiber to fiber `next` of CTA nb (the running one's, or
 * another CTA of its cluster). */
void emu_switch_fiber(EmuBlock *nb, int next) {
    EmuBlock *b = emu_blk;
    const int from = b->cur;
    if (nb == b && next == from) return;
    nb->cur = next;
    emu_blk = nb;
    emu_switch(&b->fibers[from].sp, nb->fibers[next].sp);
}
void emu_switch_to(int next) { emu_switch_fiber(emu_blk, next); }

/* The first runnable fiber by warp order (after a barrier), or -1. */
int emu_first_runnable(EmuBlock *b) {
    for (int k = 0; k < b->nwarps; k++) {
        const int w = b->order_down ? b->nwarps - 1 - k : k;
        const int lo = w * 32, hi = lo + 32 < b->nthreads ? lo + 32 : b->nthreads;
        for (int i = lo; i < hi; i++)
            if (b->fibers[i].state == EMU_RUN) return i;
    }
    return -1;
}

/* The next fiber to run once the current one waits or is done: a runnable
 * lane of the same warp, else the first by warp order. */
int emu_pick(EmuBlock *b) {
    const int cur = b->cur, lo = cur & ~31;
    const int n = lo + 32 < b->nthreads ? 32 : b->nthreads - lo;
    for (int k = 1; k <= n; k++) {
        const int i = lo + (cur - lo + k) % n;
        if (b->fibers[i].state == EMU_RUN) return i;
    }
    return emu_first_runnable(b);
}
/* As emu_pick, and when every fiber of b waits, the first runnable of the
 * cluster's next CTAs (rank order, from b's next); *nb gets its CTA. */
int emu_pick_cluster(EmuBlock *b, EmuBlock **nb) {
    *nb = b;
    const int i = emu_pick(b);
    if (i >= 0) return i;
    for (int k = 1; k < b->cl->size; k++) {
        EmuBlock *p = &b->cl->ctas[(b->rank + k) % b->cl->size];
        const int j = emu_first_runnable(p);
        if (j >= 0) {
            *nb = p;
            return j;
        }
    }
    return -1;
}

[[noreturn]] void emu_deadlock(EmuBlock *blk) {
    int waiting = 0, done = 0, mbar = 0, named = 0, cluster = 0, sync = 0;
    for (int r = 0; r < blk->cl->size; r++) {
        const EmuBlock *b = &blk->cl->ctas[r];
        sync += b->barrier_arrived;
        for (int i = 0; i < b->nthreads; i++) {
            const EmuFiber &f = b->fibers[i];
            waiting += f.state == EMU_WAIT;
            done += f.state == EMU_DONE;
            cluster += f.state == EMU_WAIT && f.wait_on == b->cl;
            for (const EmuMbar &m : b->mbars) mbar += f.state == EMU_WAIT && f.wait_on == &m;
            for (const EmuNamedBar &nb : b->nbars) named += f.state == EMU_WAIT && f.wait_on == &nb;
        }
    }
    emu_fail("deadlock in block (%u,%u,%u)%s: %d threads wait (%d at __syncthreads, %d on an mbarrier "
             "phase that never completes, %d at a named barrier (bar.sync) short of its count, %d at "
             "barrier.cluster.wait), %d returned; a barrier or collective some threads never reach, or an "
             "mbarrier nobody arrives at", blk->block_idx.x, blk->block_idx.y, blk->block_idx.z,
             blk->cl->size > 1 ? " and its cluster" : "", waiting, sync, mbar, named, cluster, done);
}

/* A CTA whose last thread returns: peers that multicast into it or arrived
 * on its mbarriers must have done so before an arrival at a barrier.cluster
 * phase that every thread of this CTA waited through (else, on hardware, the
 * peer may still write its shared memory after it is gone). */
void emu_cta_exits(EmuBlock *b) {
    emu_tma_stores_exit(b);
    b->exited = 1;
    unsigned waited = ~0u;
    for (int i = 0; i < b->nthreads; i++) waited = std::min(waited, b->fibers[i].cl_waited);
    if (b->remote_need > waited)
        emu_fail("CTA %d of its cluster exits after waiting through %u barrier.cluster phase(s), but a peer "
                 "CTA multicast into its shared memory or arrived on its mbarriers before arriving at phase "
                 "%u: nothing orders those writes before the exit (a barrier.cluster.arrive + wait before "
                 "the kernel ends is missing)", b->rank, waited, b->remote_need - 1);
}

/* Called on a fiber's own stack when its kernel returns: pick another
 * fiber, or go back to the launcher when every one is done. */
[[noreturn]] void emu_fiber_exit(void) {
    EmuBlock *b = emu_blk;
    EmuFiber *f = &b->fibers[b->cur];
    f->state = EMU_DONE;
    f->head = f->ncopies = 0;  /* copies never waited for are dropped */
    bool all = true;
    for (int i = 0; i < b->nthreads && all; i++) all = b->fibers[i].state == EMU_DONE;
    if (all) emu_cta_exits(b);
    EmuBlock *nb;
    int next = emu_pick_cluster(b, &nb);
    void *dummy;
    if (next >= 0) {
        nb->cur = next;
        emu_blk = nb;
        emu_switch(&dummy, nb->fibers[next].sp);
    } else {
        for (int r = 0; r < b->cl->size; r++)
            for (int i = 0; i < b->cl->ctas[r].nthreads; i++)
                if (b->cl->ctas[r].fibers[i].state != EMU_DONE) emu_deadlock(b);
        emu_switch(&dummy, emu_ts.main_sp);
    }
    __builtin_unreachable();
}

thread_local void (*emu_body_fn)(void *);
thread_local void *emu_body_ctx;

/* ---------------------------------------------------------------------------
 * Warp collectives, computed by the last lane to arrive. */

inline float emu_bf16_lo(uint32_t v) {
    const uint32_t u = v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline float emu_bf16_hi(uint32_t v) {
    const uint32_t u = v & 0xffff0000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void emu_do_mma(EmuWarp *w) {
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        A[g][2 * t] = emu_bf16_lo(w->a[l][0]);
        A[g][2 * t + 1] = emu_bf16_hi(w->a[l][0]);
        A[g + 8][2 * t] = emu_bf16_lo(w->a[l][1]);
        A[g + 8][2 * t + 1] = emu_bf16_hi(w->a[l][1]);
        A[g][2 * t + 8] = emu_bf16_lo(w->a[l][2]);
        A[g][2 * t + 9] = emu_bf16_hi(w->a[l][2]);
        A[g + 8][2 * t + 8] = emu_bf16_lo(w->a[l][3]);
        A[g + 8][2 * t + 9] = emu_bf16_hi(w->a[l][3]);
        B[2 * t][g] = emu_bf16_lo(w->b[l][0]);
        B[2 * t + 1][g] = emu_bf16_hi(w->b[l][0]);
        B[2 * t + 8][g] = emu_bf16_lo(w->b[l][1]);
        B[2 * t + 9][g] = emu_bf16_hi(w->b[l][1]);
    }
    float Bt[8][16];
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++) Bt[n][k] = B[k][n];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; i++) {
            const float *ar = A[g + 8 * (i >> 1)], *bc = Bt[2 * t + (i & 1)];
            float s = w->c[l][i];
            for (int k = 0; k < 16; k++) s += ar[k] * bc[k];
            w->c[l][i] = s;
        }
    }
}

void emu_do_ldmatrix(EmuWarp *w, int trans) {
    const unsigned char *sm = emu_blk->smem;
    for (int l = 0; l < 32; l++) {
        for (int i = 0; i < 4; i++) {
            uint16_t lo, hi;
            if (!trans) {
                const unsigned char *row = sm + w->addr[8 * i + (l >> 2)] + 4 * (l & 3);
                memcpy(&lo, row, 2);
                memcpy(&hi, row + 2, 2);
            } else {
                memcpy(&lo, sm + w->addr[8 * i + 2 * (l & 3)] + 2 * (l >> 2), 2);
                memcpy(&hi, sm + w->addr[8 * i + 2 * (l & 3) + 1] + 2 * (l >> 2), 2);
            }
            w->r[l][i] = (uint32_t)lo | ((uint32_t)hi << 16);
        }
    }
}

}  // namespace

/* ---------------------------------------------------------------------------
 * emu.h's entry points. */

void emu_fail(const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "emu: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (emu_blk)
        fprintf(stderr, " (block (%u,%u,%u), thread %d)", emu_blk->block_idx.x, emu_blk->block_idx.y,
                emu_blk->block_idx.z, emu_blk->cur);
    fprintf(stderr, "\n");
    exit(1);
}

extern "C" void emu_fiber_main(void) {
    emu_body_fn(emu_body_ctx);
    emu_fiber_exit();
}

void emu_wait(const void *on) {
    EmuBlock *b = emu_blk;
    b->fibers[b->cur].state = EMU_WAIT;
    b->fibers[b->cur].wait_on = on;
    EmuBlock *nb;
    const int next = emu_pick_cluster(b, &nb);
    if (next < 0) emu_deadlock(b);
    emu_switch_fiber(nb, next);
}

/* Wakes every fiber of CTA b waiting on `on`. */
static void emu_wake_in(EmuBlock *b, const void *on) {
    for (int i = 0; i < b->nthreads; i++)
        if (b->fibers[i].state == EMU_WAIT && b->fibers[i].wait_on == on) b->fibers[i].state = EMU_RUN;
}
void emu_wake(const void *on) { emu_wake_in(emu_blk, on); }

void emu_warp_complete(EmuWarp *w, int op) {
    EmuBlock *b = emu_blk;
    switch (op) {
    case EMU_OP_SYNCWARP: break;
    case EMU_OP_SHFL_XOR:
        for (int l = 0; l < 32; l++) w->shfl[l] = w->v[l ^ (w->arg[l] & 31)];
        break;
    case EMU_OP_LDSM: emu_do_ldmatrix(w, 0); break;
    case EMU_OP_LDSM_T: emu_do_ldmatrix(w, 1); break;
    case EMU_OP_MMA: emu_do_mma(w); break;
    default: emu_fail("unknown warp collective %d", op);
    }
    w->arrived = 0;
    const int lo = b->cur & ~31;
    for (int i = lo; i < lo + 32; i++)
        if (b->fibers[i].state == EMU_WAIT && b->fibers[i].wait_on == w) b->fibers[i].state = EMU_RUN;
}

void emu_syncthreads(void) {
    EmuBlock *b = emu_blk;
    if (++b->barrier_arrived < b->nthreads) {
        emu_wait(&b->barrier_arrived);
        return;
    }
    b->barrier_arrived = 0;
    emu_wake(&b->barrier_arrived);
    emu_switch_to(emu_first_runnable(b));  /* the warp order decides who goes first */
}

void emu_cp_queue(EmuFiber *f, const EmuCopy &c) {
    if (f->ncopies == f->cap) {
        if (f->head > 0) {  /* compact */
            memmove(f->copies, f->copies + f->head, (size_t)(f->ncopies - f->head) * sizeof(EmuCopy));
            f->ncopies -= f->head;
            f->head = 0;
        }
        if (f->ncopies == f->cap) {
            f->cap = f->cap ? 2 * f->cap : 64;
            f->copies = (EmuCopy *)realloc(f->copies, (size_t)f->cap * sizeof(EmuCopy));
            if (!f->copies) emu_fail("out of memory for cp.async queues");
        }
    }
    f->copies[f->ncopies++] = c;
}

void emu_cp_land(EmuFiber *f, int upto_group) {
    while (f->head < f->ncopies) {
        const EmuCopy &c = f->copies[f->head];
        if (c.group < 0 || c.group >= upto_group) break;  /* groups land in commit order */
        if (c.src_n) memcpy(c.dst, c.src, (size_t)c.src_n);
        memset(c.dst + c.src_n, 0, (size_t)(c.n - c.src_n));
        f->head++;
    }
    if (f->head == f->ncopies) f->head = f->ncopies = 0;
}

/* "cpu emulation, cp.async late, warps up" (sm_80, the default), or
 * "cpu emulation of sm_90a (1 SM), cp.async late, warps up". */
extern "C" const char *emu_describe(void) {
    emu_settings();
    static thread_local char name[96];
    char arch[48] = "";
    if (emu_ts.sm90) snprintf(arch, sizeof arch, " of sm_90a (%d SM%s)", emu_ts.sms, emu_ts.sms == 1 ? "" : "s");
    snprintf(name, sizeof name, "cpu emulation%s, cp.async %s, warps %s", arch, emu_ts.cp_late ? "late" : "early",
             emu_ts.order_down ? "down" : "up");
    return name;
}

/* ---------------------------------------------------------------------------
 * sm_90a: static shared addresses, mbarriers, TMA, warpgroup collectives and
 * wgmma (see emu.h's header for the rules each follows). */

uint32_t emu_static_shared(const void *p) {
    EmuCluster *b = emu_blk->cl;
    for (int i = 0; i < b->nstatics; i++)
        if (b->statics[i] == p) return EMU_STATIC_BASE + 16u * (uint32_t)i;
    if (b->nstatics == EMU_MAX_STATICS) emu_fail("more than %d static __shared__ addresses taken", EMU_MAX_STATICS);
    b->statics[b->nstatics] = p;
    return EMU_STATIC_BASE + 16u * (uint32_t)b->nstatics++;
}

namespace {

/* The 128-byte swizzle of a shared address: its 16-byte chunk index within
 * a 128-byte row (bits 4-6) XOR the row's index within a 1024-byte group of
 * eight rows (bits 7-9). */
inline uint32_t emu_swizzle128(uint32_t addr) { return addr ^ (((addr >> 7) & 7u) << 4); }

/* The mbarrier at shared address bar of CTA b (the running one by default). */
EmuMbar *emu_mbar_find(uint32_t bar, const char *what, EmuBlock *b = emu_blk) {
    for (EmuMbar &m : b->mbars)
        if (m.addr == bar) return &m;
    emu_fail("%s: no mbarrier initialised at shared address 0x%x%s", what, bar,
             b == emu_blk ? "" : " of the peer CTA");
}

/* A phase completes when every arrival is in and every transaction byte
 * has landed (a peer's multicast may complete its bytes before the local
 * expect_tx: the count goes below zero meanwhile, as on hardware); its
 * waiters (in CTA b) are woken to look again either way. */
void emu_mbar_update(EmuMbar *m, EmuBlock *b = emu_blk) {
    if (m->pending == 0 && m->tx == 0) {
        m->phase++;
        m->pending = m->expected;
    }
    emu_wake_in(b, m);
}

/* The tensor map as the emulated cuTensorMapEncodeTiled stores it in the
 * opaque 128 bytes of a CUtensorMap. */
struct EmuTensorMap {
    uint64_t magic;
    const unsigned char *base;
    uint64_t dim[2];        /* elements: inner, outer */
    uint64_t pitch;         /* bytes between outer rows */
    uint32_t box[2];        /* elements: inner, outer */
    uint32_t swizzle128;    /* 1: CU_TENSOR_MAP_SWIZZLE_128B, 0: none */
};
static_assert(sizeof(EmuTensorMap) <= sizeof(CUtensorMap), "an emulated map fits a CUtensorMap");
constexpr uint64_t EMU_MAP_MAGIC = 0x50414d524f534e45ull;

const EmuTensorMap *emu_map(const CUtensorMap *map) {
    const EmuTensorMap *t = (const EmuTensorMap *)(const void *)map;
    if (t->magic != EMU_MAP_MAGIC) emu_fail("cp.async.bulk.tensor: not a tensor map from cuTensorMapEncodeTiled");
    return t;
}
uint32_t emu_box_bytes(const EmuTensorMap *t) { return t->box[0] * t->box[1] * 2; }

/* Moves one box into shared memory: element (r, c) of the box, global
 * (c1 + r, c0 + c) or zero outside the tensor, to dst + r * rowbytes + 2 c,
 * swizzled. */
void emu_tma_land(const EmuTma &c, unsigned char *sm) {
    const EmuTensorMap *t = emu_map(c.map);
    const uint32_t rowbytes = t->box[0] * 2;
    for (uint32_t r = 0; r < t->box[1]; r++)
        for (uint32_t e = 0; e < t->box[0]; e++) {
            const long long gi = (long long)c.c0 + e, go = (long long)c.c1 + r;
            uint16_t v = 0;
            if (gi >= 0 && go >= 0 && (uint64_t)gi < t->dim[0] && (uint64_t)go < t->dim[1])
                memcpy(&v, t->base + (uint64_t)go * t->pitch + (uint64_t)gi * 2, 2);
            uint32_t a = c.dst + r * rowbytes + 2 * e;
            if (t->swizzle128) a = emu_swizzle128(a);
            memcpy(sm + a, &v, 2);
        }
}

float emu_bf16_at(uint32_t addr) {
    if ((size_t)addr + 2 > emu_blk->smem_size)
        emu_fail("wgmma: operand address 0x%x beyond the %zu bytes of dynamic shared memory", addr,
                 emu_blk->smem_size);
    uint16_t h;
    memcpy(&h, emu_blk->smem + addr, 2);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element (mn, k) of an operand through its matrix descriptor: the
 * canonical layouts of the 128-byte swizzle for 16-bit types,
 *   k-major  (trans 0): start + (mn % 8) 128 + (mn / 8) SBO + 2 k
 *   mn-major (trans 1): start + 2 (mn % 64) + (mn / 64) LBO + (k % 8) 128 + (k / 8) SBO
 * then swizzled. Only swizzle mode 1 (128 bytes) and base offset 0 are
 * emulated; reserved bits must be zero. */
struct EmuDesc {
    uint32_t start, lbo, sbo;
};
EmuDesc emu_desc(uint64_t d, const char *which) {
    const uint64_t reserved = (3ull << 14) | (3ull << 30) | (7ull << 46) | (1023ull << 52);
    if (d & reserved) emu_fail("wgmma: %s descriptor 0x%016llx sets reserved bits", which, (unsigned long long)d);
    if ((d >> 49) & 7) emu_fail("wgmma: %s descriptor has a base offset (not emulated)", which);
    if ((d >> 62) != 1)
        emu_fail("wgmma: %s descriptor's swizzle mode %u is not emulated (1, 128 bytes, is)", which, (unsigned)(d >> 62));
    return {(uint32_t)(d & 0x3FFF) << 4, (uint32_t)((d >> 16) & 0x3FFF) << 4, (uint32_t)((d >> 32) & 0x3FFF) << 4};
}
float emu_operand(const EmuDesc &g, int trans, int mn, int k) {
    const uint32_t off = trans ? 2u * (mn % 64) + (uint32_t)(mn / 64) * g.lbo + 128u * (k % 8) + (uint32_t)(k / 8) * g.sbo
                               : 128u * (mn % 8) + (uint32_t)(mn / 8) * g.sbo + 2u * k;
    return emu_bf16_at(emu_swizzle128(g.start + off));
}

/* The product of either form of wgmma, once A (64 x 16) is in hand: reads
 * B (16 x op.n) from shared memory through gb now and accumulates A B into
 * every thread's fragment (warp w rows 16w + lane/4 and + 8, columns
 * 8j + 2 (lane % 4) + {0, 1} in d[4j .. 4j + 3]), k in order, in fp32. */
void emu_wgmma_acc(const float (*A)[16], const EmuDesc &gb, const EmuWgmma &op) {
    static thread_local float Bt[256][16];
    for (int n = 0; n < op.n; n++)
        for (int k = 0; k < 16; k++) Bt[n][k] = emu_operand(gb, op.tb, n, k);
    for (int t = 0; t < 128; t++) {
        const int w = t >> 5, l = t & 31;
        float *d = op.d[t];
        for (int j = 0; j < op.n / 8; j++)
            for (int i = 0; i < 4; i++) {
                const float *ar = A[16 * w + (l >> 2) + 8 * (i >> 1)], *bc = Bt[8 * j + 2 * (l & 3) + (i & 1)];
                float s = d[4 * j + i];
                for (int k = 0; k < 16; k++) s += ar[k] * bc[k];
                d[4 * j + i] = s;
            }
    }
}

/* Runs one wgmma: reads A and B from shared memory now (emu_wgmma_acc). */
void emu_wgmma_run(const EmuWgmma &op) {
    if (emu_wgmma_rs_run(op)) return;  /* A from registers (attention_sm90.cu; at the end of this file) */
    const EmuDesc ga = emu_desc(op.da, "A"), gb = emu_desc(op.db, "B");
    static thread_local float A[64][16];
    for (int m = 0; m < 64; m++)
        for (int k = 0; k < 16; k++) A[m][k] = emu_operand(ga, op.ta, m, k);
    emu_wgmma_acc(A, gb, op);
}

const char *emu_wg_name(int op) {
    switch (op) {
    case EMU_WG_FENCE: return "wgmma.fence";
    case EMU_WG_MMA: return "wgmma.mma_async";
    case EMU_WG_COMMIT: return "wgmma.commit_group";
    case EMU_WG_WAIT: return "wgmma.wait_group";
    case EMU_WG_SETMAXNREG: return "setmaxnreg";
    }
    return "?";
}

/* The last of the warpgroup's 128 threads to arrive: check that every
 * thread gave the same operands, then do the collective. */
void emu_wg_complete(EmuWarpgroup *g, int op) {
    for (int t = 1; t < 128; t++)
        if (g->a[t] != g->a[0] || g->b[t] != g->b[0] || g->arg[t] != g->arg[0])
            emu_fail("%s: the warpgroup's threads disagree on its operands (thread %d of it)", emu_wg_name(op), t);
    const bool late = emu_blk->cp_late;
    switch (op) {
    case EMU_WG_FENCE: break;
    case EMU_WG_SETMAXNREG: {
        const uint64_t r = g->a[0];
        if (r < 24 || r > 256 || r % 8) emu_fail("setmaxnreg: %llu registers (24 to 256, a multiple of 8)", (unsigned long long)r);
        break;
    }
    case EMU_WG_MMA: {
        EmuWgmma w;
        w.da = g->a[0];
        w.db = g->b[0];
        w.ta = g->arg[0] & 1;
        w.tb = (g->arg[0] >> 1) & 1;
        w.n = g->arg[0] >> 2;
        for (int t = 0; t < 128; t++) w.d[t] = g->d[t];
        if (late) g->open.push_back(w);
        else emu_wgmma_run(w);  /* early: reads its operands as it is issued */
        break;
    }
    case EMU_WG_COMMIT:
        g->groups.push_back(g->open);
        g->open.clear();
        break;
    case EMU_WG_WAIT:
        while (g->groups.size() > g->a[0]) {  /* late: the oldest groups run now */
            for (const EmuWgmma &w : g->groups.front()) emu_wgmma_run(w);
            g->groups.pop_front();
        }
        break;
    }
    g->arrived = 0;
    emu_wake(g);
}

}  // namespace

void emu_mbar_init(uint32_t bar, uint32_t count) {
    EmuBlock *b = emu_blk;
    if (bar % 8) emu_fail("mbarrier.init: address 0x%x not 8-byte aligned", bar);
    if (count < 1 || count > (1u << 20) - 1) emu_fail("mbarrier.init: count %u outside 1..2^20-1", count);
    for (EmuMbar &m : b->mbars)
        if (m.addr == bar) {
            if (!m.inflight.empty()) emu_fail("mbarrier.init at 0x%x while TMA copies are in flight on it", bar);
            m = EmuMbar{bar, count, count, 0, 0, {}};
            return;
        }
    b->mbars.push_back(EmuMbar{bar, count, count, 0, 0, {}});
}

void emu_mbar_arrive(uint32_t bar, uint32_t tx_bytes) {
    EmuMbar *m = emu_mbar_find(bar, "mbarrier.arrive");
    if (m->pending == 0) emu_fail("mbarrier.arrive at 0x%x: no arrival pending", bar);
    m->tx += tx_bytes;
    if (m->tx >= (1ll << 20)) emu_fail("mbarrier at 0x%x: %lld transaction bytes pending (2^20-1 at most)", bar, m->tx);
    m->pending--;
    emu_mbar_update(m);
}

/* try_wait.parity in a loop: the phase of parity `parity` has completed when
 * the current phase's parity differs from it. Late TMA copies on the
 * barrier land when a waiter finds every arrival in. */
void emu_mbar_wait(uint32_t bar, uint32_t parity) {
    for (;;) {
        EmuMbar *m = emu_mbar_find(bar, "mbarrier.try_wait");
        if ((m->phase & 1u) != (parity & 1u)) return;
        if (m->pending == 0 && !m->inflight.empty()) {
            /* in issue order, until the phase's bytes are in: a box issued
             * beyond them (a peer's multicast for the stage's next round)
             * stays in flight for the next phase */
            size_t i = 0;
            while (i < m->inflight.size() && (i == 0 || m->tx != 0)) {
                emu_tma_land(m->inflight[i], emu_blk->smem);
                m->tx -= emu_box_bytes(emu_map(m->inflight[i].map));
                i++;
            }
            m->inflight.erase(m->inflight.begin(), m->inflight.begin() + (long)i);
            emu_mbar_update(m);
            continue;
        }
        emu_wait(m);
    }
}

/* One box into CTA b's shared memory at dst, its bytes completed on b's
 * mbarrier at bar (the running CTA's own, or a multicast's target). */
static void emu_tma_into(EmuBlock *b, uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    const EmuTensorMap *t = emu_map(map);
    EmuMbar *m = emu_mbar_find(bar, "cp.async.bulk.tensor", b);
    const uint32_t bytes = emu_box_bytes(t);
    if (dst % (t->swizzle128 ? 1024u : 128u))
        emu_fail("cp.async.bulk.tensor: shared address 0x%x not %u-byte aligned", dst, t->swizzle128 ? 1024u : 128u);
    if ((size_t)dst + bytes > b->smem_size)
        emu_fail("cp.async.bulk.tensor: a %u-byte box at 0x%x beyond the %zu bytes of dynamic shared memory", bytes, dst,
                 b->smem_size);
    const EmuTma c = {map, c0, c1, dst};
    if (b->cp_late) {
        memset(b->smem + dst, 0xFF, bytes);  /* in flight: NaN until it lands */
        m->inflight.push_back(c);
        emu_wake_in(b, m);  /* a waiter that found every arrival in lands it (a peer's multicast may come last) */
    } else {
        emu_tma_land(c, b->smem);
        m->tx -= bytes;
        emu_mbar_update(m, b);
    }
}
void emu_tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    emu_tma_into(emu_blk, dst, map, c0, c1, bar);
}

/* A TMA store of CTA b: box element (r, c) from the shared memory at
 * src + r * rowbytes + 2 c (swizzled) to global (c1 + r, c0 + c), clipped
 * to the tensor. */
static void emu_tma_store_land(const EmuTmaStore &c, const EmuBlock *b) {
    const EmuTensorMap *t = emu_map(c.map);
    const uint32_t rowbytes = t->box[0] * 2;
    unsigned char *base = (unsigned char *)t->base;  /* a store map's tensor is written */
    for (uint32_t r = 0; r < t->box[1]; r++)
        for (uint32_t e = 0; e < t->box[0]; e++) {
            const long long gi = (long long)c.c0 + e, go = (long long)c.c1 + r;
            if (gi < 0 || go < 0 || (uint64_t)gi >= t->dim[0] || (uint64_t)go >= t->dim[1]) continue;
            uint32_t a = c.src + r * rowbytes + 2 * e;
            if (t->swizzle128) a = emu_swizzle128(a);
            memcpy(base + (uint64_t)go * t->pitch + (uint64_t)gi * 2, b->smem + a, 2);
        }
}

void emu_tma_store_2d(const CUtensorMap *map, int c0, int c1, uint32_t src) {
    EmuBlock *b = emu_blk;
    const EmuTensorMap *t = emu_map(map);
    const uint32_t bytes = emu_box_bytes(t);
    if (src % (t->swizzle128 ? 1024u : 128u))
        emu_fail("cp.async.bulk.tensor (store): shared address 0x%x not %u-byte aligned", src,
                 t->swizzle128 ? 1024u : 128u);
    if ((size_t)src + bytes > b->smem_size)
        emu_fail("cp.async.bulk.tensor (store): a %u-byte box at 0x%x beyond the %zu bytes of dynamic shared memory",
                 bytes, src, b->smem_size);
    const EmuTmaStore c = {map, c0, c1, src, emu_self()->linear, -1};
    if (b->cp_late) b->stores.push_back(c);
    else emu_tma_store_land(c, b);
}

void emu_bulk_commit(void) {
    EmuFiber *f = emu_self();
    for (EmuTmaStore &c : emu_blk->stores)
        if (c.tid == f->linear && c.group < 0) c.group = f->bulk_committed;
    f->bulk_committed++;
}

void emu_bulk_wait_read(int n) {
    EmuBlock *b = emu_blk;
    EmuFiber *f = emu_self();
    std::vector<EmuTmaStore> left;
    for (const EmuTmaStore &c : b->stores) {
        if (c.tid == f->linear && c.group >= 0 && c.group < f->bulk_committed - n) emu_tma_store_land(c, b);
        else left.push_back(c);
    }
    b->stores.swap(left);
}

/* CTA b exits: its TMA stores still in flight complete (reading its shared memory as it is now). */
void emu_tma_stores_exit(EmuBlock *b) {
    for (const EmuTmaStore &c : b->stores) emu_tma_store_land(c, b);
    b->stores.clear();
}

static EmuWarpgroup *emu_my_wg(int op) {
    EmuBlock *b = emu_blk;
    const int t = emu_self()->linear;
    if (!b->wgs || (size_t)(t / 128) >= b->wgs->size())
        emu_fail("%s: thread %d is not in a whole warpgroup (a block of %d threads)", emu_wg_name(op), t, b->nthreads);
    return &(*b->wgs)[(size_t)(t / 128)];
}

static void emu_wg_arrive(EmuWarpgroup *g, int op) {
    if (g->arrived == 0) g->op = op;
    else if (g->op != op)
        emu_fail("warpgroup %d: threads at different collectives (%s and %s): divergent warpgroup",
                 emu_self()->linear / 128, emu_wg_name(g->op), emu_wg_name(op));
    if (++g->arrived < 128) emu_wait(g);
    else emu_wg_complete(g, op);
}

void emu_wg_collective(int op, uint64_t a, uint64_t b, float *d) {
    EmuWarpgroup *g = emu_my_wg(op);
    const int t = emu_self()->linear % 128;
    g->a[t] = a;
    g->b[t] = b;
    g->arg[t] = 0;
    g->d[t] = d;
    emu_wg_arrive(g, op);
}

void emu_wgmma(uint64_t da, uint64_t db, int ta, int tb, int n, float *d) {
    if (n % 8 || n < 8 || n > 256) emu_fail("wgmma: n %d", n);
    EmuWarpgroup *g = emu_my_wg(EMU_WG_MMA);
    const int t = emu_self()->linear % 128;
    g->a[t] = da;
    g->b[t] = db;
    g->arg[t] = ta | tb << 1 | n << 2;
    g->d[t] = d;
    emu_wg_arrive(g, EMU_WG_MMA);
}

/* Named barriers, bar.sync / bar.arrive (barrier.sync.aligned /
 * barrier.arrive.aligned): a phase opens with its first arrival's count and
 * completes when that many threads are in; bar.sync then waits for the
 * completion, bar.arrive does not. Stricter than the PTX ISA where it
 * leaves a bug silent: an arrival with another count than the phase's, a
 * thread arriving twice in one phase (hardware would count its warp again
 * and release the barrier early: an ordering lost without a trace), a
 * phase that completes with a warp only partly in (.aligned: the whole
 * warp executes it), and a block that ends with a phase open (checked at
 * the block's end) all stop the program. */
void emu_named_bar(int id, int count, int sync) {
    EmuBlock *b = emu_blk;
    const char *what = sync ? "bar.sync" : "bar.arrive";
    if (id < 1 || id >= EMU_NAMED_BARS)
        emu_fail("%s %d: named barriers 1 to %d are emulated (0 is __syncthreads')", what, id, EMU_NAMED_BARS - 1);
    const int warps_up = (b->nthreads + 31) / 32 * 32;
    if (count < 32 || count % 32 || count > warps_up)
        emu_fail("%s %d, %d: the count must be a multiple of 32 from 32 to the block's %d threads", what, id, count,
                 warps_up);
    EmuNamedBar &nb = b->nbars[id];
    if (nb.arrived == 0) nb.count = count;
    else if (nb.count != count)
        emu_fail("%s %d, %d: this phase of the barrier was opened with count %d (%d threads in)", what, id, count,
                 nb.count, nb.arrived);
    const int t = emu_self()->linear, warp = t >> 5;
    const uint32_t bit = 1u << (t & 31);
    if (nb.lanes[warp] & bit)
        emu_fail("%s %d, %d: thread %d arrives a second time before the phase completes (%d of %d in); hardware "
                 "would count its warp twice and release the barrier early", what, id, count, t, nb.arrived, nb.count);
    nb.lanes[warp] |= bit;
    if (++nb.arrived == nb.count) {
        for (int w = 0; w < b->nwarps; w++) {
            const int lanes = w * 32 + 32 <= b->nthreads ? 32 : b->nthreads - w * 32;
            const uint32_t all = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
            if (nb.lanes[w] && nb.lanes[w] != all)
                emu_fail("%s %d, %d: the phase completed with warp %d only partly in (lanes 0x%08x): a count that "
                         "does not match the warps arriving, or a divergent warp", what, id, count, w, nb.lanes[w]);
        }
        nb.arrived = 0;
        memset(nb.lanes, 0, sizeof nb.lanes);
        nb.phase++;
        emu_wake(&nb);
        return;
    }
    if (!sync) return;
    const unsigned mine = nb.phase;
    while (nb.phase == mine) emu_wait(&nb);
}

/* ---------------------------------------------------------------------------
 * Clusters (emu.h's header, "Clusters"): multicast TMA, mapa and remote
 * mbarrier arrivals, barrier.cluster, and the exit rule. */

/* Before the running thread writes into CTA t's shared memory or arrives on
 * its mbarrier (t another CTA of its cluster): t must still run, and it must
 * not exit before waiting through the barrier.cluster phase this thread
 * arrives at next (emu_cta_exits checks that). */
static void emu_remote_op(EmuBlock *t, const char *what) {
    if (t == emu_blk) return;
    if (t->exited)
        emu_fail("%s into CTA %d of the cluster, which has exited: on hardware a write into the shared memory "
                 "of a CTA that is gone (its exit was not held back by a barrier.cluster after the peer's last "
                 "remote operation)", what, t->rank);
    t->remote_need = std::max(t->remote_need, emu_self()->cl_arrived + 1);
}

void emu_tma_2d_multicast(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar, uint16_t mask) {
    EmuCluster *cl = emu_blk->cl;
    if (mask == 0 || (mask >> cl->size) != 0)
        emu_fail("cp.async.bulk.tensor .multicast::cluster: cta mask 0x%x names CTAs outside the cluster of %d",
                 mask, cl->size);
    for (int r = 0; r < cl->size; r++)
        if (mask >> r & 1) {
            emu_remote_op(&cl->ctas[r], "cp.async.bulk.tensor .multicast::cluster");
            emu_tma_into(&cl->ctas[r], dst, map, c0, c1, bar);
        }
}

uint32_t emu_mapa(uint32_t addr, uint32_t rank) {
    const EmuCluster *cl = emu_blk->cl;
    if (rank >= (uint32_t)cl->size) emu_fail("mapa: CTA rank %u outside the cluster of %d", rank, cl->size);
    if (addr & EMU_CLUSTER_MASK) emu_fail("mapa: 0x%x is already a shared::cluster address of another CTA", addr);
    return addr | (rank + 1) << EMU_CLUSTER_SHIFT;
}

void emu_mbar_arrive_cluster(uint32_t addr) {
    EmuCluster *cl = emu_blk->cl;
    const uint32_t r = addr >> EMU_CLUSTER_SHIFT & 0xF, bar = addr & ~EMU_CLUSTER_MASK;
    if (r > (uint32_t)cl->size)
        emu_fail("mbarrier.arrive.shared::cluster at 0x%x: CTA rank %u outside the cluster of %d", addr, r - 1,
                 cl->size);
    EmuBlock *t = r ? &cl->ctas[r - 1] : emu_blk;
    emu_remote_op(t, "mbarrier.arrive.shared::cluster");
    EmuMbar *m = emu_mbar_find(bar, "mbarrier.arrive.shared::cluster", t);
    if (m->pending == 0) emu_fail("mbarrier.arrive.shared::cluster at 0x%x: no arrival pending", addr);
    m->pending--;
    emu_mbar_update(m, t);
}

/* barrier.cluster.arrive / wait: every thread of every CTA of the cluster
 * arrives, then waits for that phase; an arrive twice without a wait, or a
 * wait without an arrive, stops the program (the PTX ISA leaves them
 * undefined). */
void emu_cluster_arrive(void) {
    EmuCluster *cl = emu_blk->cl;
    EmuFiber *f = emu_self();
    if (f->cl_arrived != f->cl_waited)
        emu_fail("barrier.cluster.arrive a second time without a barrier.cluster.wait between");
    f->cl_arrived++;
    if (++cl->arrived < cl->nthreads) return;
    cl->arrived = 0;
    cl->phase++;
    for (int r = 0; r < cl->size; r++) emu_wake_in(&cl->ctas[r], cl);
}
void emu_cluster_wait(void) {
    EmuCluster *cl = emu_blk->cl;
    EmuFiber *f = emu_self();
    if (f->cl_arrived == f->cl_waited) emu_fail("barrier.cluster.wait without a barrier.cluster.arrive before it");
    while (cl->phase < f->cl_arrived) emu_wait(cl);
    emu_self()->cl_waited = f->cl_arrived;
}

cudaError_t emu_cluster_check(dim3 grid, dim3 cluster) {
    const unsigned long long n = (unsigned long long)cluster.x * cluster.y * cluster.z;
    if (n == 0 || n > EMU_MAX_CLUSTER || grid.x % cluster.x || grid.y % cluster.y || grid.z % cluster.z)
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

/* As many clusters of the configuration's size as fit the device at once:
 * one CTA an SM (the GEMM's 218 KB of shared memory), so SMs / size; 0 where
 * a cluster is larger than the device. */
cudaError_t cudaOccupancyMaxActiveClusters(int *n, const void *, const cudaLaunchConfig_t *c) {
    emu_settings();
    dim3 cl(1, 1, 1);
    for (unsigned i = 0; i < c->numAttrs; i++)
        if (c->attrs[i].id == cudaLaunchAttributeClusterDimension)
            cl = dim3(c->attrs[i].val.clusterDim.x, c->attrs[i].val.clusterDim.y, c->attrs[i].val.clusterDim.z);
    const unsigned size = cl.x * cl.y * cl.z;
    if (size == 0 || size > EMU_MAX_CLUSTER) return cudaErrorInvalidValue;
    *n = emu_ts.sms / (int)size;
    return cudaSuccess;
}

/* ---------------------------------------------------------------------------
 * The emulated device's per-kernel dynamic shared memory limits
 * (cudaFuncSetAttribute), the one piece of state outside the scheduler. */

namespace {
std::mutex emu_attr_lock;
std::map<const void *, int> emu_smem_limit;
}  // namespace

/* Runs the grid, a cluster at a time (a launch without clusters: clusters
 * of one CTA): the CTAs of a cluster start together, their fibers scheduled
 * as one larger block's (emu_pick_cluster), each CTA with its own shared
 * memory, mbarriers, named barriers, warps and warpgroups; the cluster's
 * statics table and barrier.cluster are shared. */
void emu_run_grid(dim3 grid, dim3 block, dim3 cluster, size_t smem, const void *kernel, const char *name,
                  void (*body)(void *), void *ctx) {
    emu_settings();
    const unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
    if (nt == 0 || nt > 1024 || block.z > 64) emu_fail("launch of %s: block %ux%ux%u", name, block.x, block.y, block.z);
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u)
        emu_fail("launch of %s: grid %ux%ux%u", name, grid.x, grid.y, grid.z);
    if (emu_cluster_check(grid, cluster) != cudaSuccess)
        emu_fail("launch of %s: grid %ux%ux%u in clusters of %ux%ux%u", name, grid.x, grid.y, grid.z, cluster.x,
                 cluster.y, cluster.z);
    size_t limit = EMU_SMEM_DEFAULT;
    {
        std::lock_guard<std::mutex> g(emu_attr_lock);
        auto it = emu_smem_limit.find(kernel);
        if (it != emu_smem_limit.end() && (size_t)it->second > limit) limit = (size_t)it->second;
    }
    if (smem > limit)
        emu_fail("launch of %s: %zu bytes of dynamic shared memory, the limit is %zu "
                 "(cudaFuncSetAttribute not called?)", name, smem, limit);
    if (emu_blk) emu_fail("a kernel launched from inside a kernel");

    const int n = (int)nt, nwarps = (n + 31) / 32;
    const int csize = (int)(cluster.x * cluster.y * cluster.z);
    if (csize > emu_ts.sms)
        emu_fail("launch of %s: clusters of %d CTAs on a device of %d SMs (they cannot run together)", name, csize,
                 emu_ts.sms);
    emu_ensure_stacks(n * csize);
    std::vector<std::vector<EmuFiber>> fibers((size_t)csize, std::vector<EmuFiber>((size_t)n));
    std::vector<std::vector<EmuWarp>> warps((size_t)csize, std::vector<EmuWarp>((size_t)nwarps));
    std::vector<std::vector<EmuWarpgroup>> wgs((size_t)csize, std::vector<EmuWarpgroup>((size_t)(n % 128 ? 0 : n / 128)));
    std::vector<std::vector<unsigned char>> sm((size_t)csize, std::vector<unsigned char>(smem + EMU_SMEM_GUARD));
    std::vector<EmuBlock> blocks((size_t)csize);
    EmuCluster cl{};
    cl.size = csize;
    cl.dim = cluster;
    cl.ctas = blocks.data();
    cl.nthreads = n * csize;
    for (int r = 0; r < csize; r++) {
        EmuBlock &b = blocks[(size_t)r];
        b.nthreads = n;
        b.nwarps = nwarps;
        b.fibers = fibers[(size_t)r].data();
        b.warps = warps[(size_t)r].data();
        b.wgs = &wgs[(size_t)r];
        b.smem = sm[(size_t)r].data();
        b.smem_size = smem;
        b.grid_dim = grid;
        b.block_dim = block;
        b.cp_late = emu_ts.cp_late;
        b.order_down = emu_ts.order_down;
        b.cl = &cl;
        b.rank = r;
    }
    emu_body_fn = body;
    emu_body_ctx = ctx;

    for (unsigned cz = 0; cz < grid.z; cz += cluster.z)
        for (unsigned cy = 0; cy < grid.y; cy += cluster.y)
            for (unsigned cx = 0; cx < grid.x; cx += cluster.x) {
                cl.arrived = 0;
                cl.phase = 0;
                cl.nstatics = 0;
                for (int r = 0; r < csize; r++) {
                    EmuBlock &b = blocks[(size_t)r];
                    /* %cluster_ctarank: x fastest within the cluster */
                    b.block_idx = make_uint3(cx + (unsigned)r % cluster.x, cy + (unsigned)r / cluster.x % cluster.y,
                                             cz + (unsigned)r / (cluster.x * cluster.y));
                    b.barrier_arrived = 0;
                    b.exited = 0;
                    b.remote_need = 0;
                    b.cur = 0;
                    memset(sm[(size_t)r].data(), 0xFF, sm[(size_t)r].size());  /* uninitialised shared memory: NaN */
                    for (auto &w : warps[(size_t)r]) w.arrived = 0;
                    for (auto &g : wgs[(size_t)r]) {
                        g.arrived = 0;
                        g.open.clear();
                        g.groups.clear();
                    }
                    b.mbars.clear();
                    b.stores.clear();
                    memset(b.nbars, 0, sizeof b.nbars);
                    for (int i = 0; i < n; i++) {
                        EmuFiber &f = b.fibers[i];
                        f.state = EMU_RUN;
                        f.tid = make_uint3((unsigned)i % block.x, (unsigned)i / block.x % block.y,
                                           (unsigned)i / (block.x * block.y));
                        f.linear = i;
                        f.head = f.ncopies = f.committed = f.bulk_committed = 0;
                        f.wait_on = nullptr;
                        f.cl_arrived = f.cl_waited = 0;
                        char *st = emu_stack(r * n + i);
                        memcpy(st, &EMU_CANARY, sizeof EMU_CANARY);
                        f.sp = emu_stack_init(st, EMU_STACK);
                    }
                }
                EmuBlock &b0 = blocks[0];
                emu_blk = &b0;
                b0.cur = emu_first_runnable(&b0);
                emu_switch(&emu_ts.main_sp, b0.fibers[b0.cur].sp);
                emu_blk = nullptr;
                if (cl.arrived)
                    emu_fail("launch of %s, cluster at block (%u,%u,%u): it ended with %d threads arrived at a "
                             "barrier.cluster phase nobody completed", name, cx, cy, cz, cl.arrived);
                for (int r = 0; r < csize; r++) {
                    EmuBlock &b = blocks[(size_t)r];
                    const unsigned bx = b.block_idx.x, by = b.block_idx.y, bz = b.block_idx.z;
                    for (const auto &m : b.mbars)
                        if (!m.inflight.empty())
                            emu_fail("launch of %s, block (%u,%u,%u): it ended with %zu TMA copies in flight on the "
                                     "mbarrier at 0x%x (never waited for)", name, bx, by, bz, m.inflight.size(), m.addr);
                    for (int id = 1; id < EMU_NAMED_BARS; id++)
                        if (b.nbars[id].arrived)
                            emu_fail("launch of %s, block (%u,%u,%u): it ended with %d threads arrived at named barrier "
                                     "%d (count %d), a phase nobody completed: an arrival never waited for",
                                     name, bx, by, bz, b.nbars[id].arrived, id, b.nbars[id].count);
                    for (size_t g = 0; g < wgs[(size_t)r].size(); g++)
                        if (!wgs[(size_t)r][g].open.empty() || !wgs[(size_t)r][g].groups.empty())
                            emu_fail("launch of %s, block (%u,%u,%u): warpgroup %zu ended with wgmma in flight "
                                     "(no wgmma.wait_group 0 after the last)", name, bx, by, bz, g);
                    for (int i = 0; i < n; i++)
                        if (memcmp(emu_stack(r * n + i), &EMU_CANARY, sizeof EMU_CANARY))
                            emu_fail("launch of %s: thread %d overflowed its %zu-byte fiber stack", name, i, EMU_STACK);
                    for (size_t i = smem; i < sm[(size_t)r].size(); i++)
                        if (sm[(size_t)r][i] != 0xFF)
                            emu_fail("launch of %s, block (%u,%u,%u): a store past the %zu bytes of dynamic shared "
                                     "memory", name, bx, by, bz, smem);
                }
            }
    for (auto &v : fibers)
        for (auto &f : v) free(f.copies);
}

/* ---------------------------------------------------------------------------
 * The CUDA runtime calls the kernels' host code makes. The emulated device
 * is compute capability 8.0 (mma.sync, ldmatrix, cp.async), or 9.0 with
 * EMU_ARCH=sm_90a; every device of EMU_GPUS is the same. */

/* The emulated driver is as new as the runtime it was built against. */
cudaError_t cudaDriverGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : e == cudaErrorInvalidValue ? "invalid argument" : "not emulated";
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int) {
    emu_settings();
    switch (a) {
    case cudaDevAttrComputeCapabilityMajor: *v = emu_ts.sm90 ? 9 : 8; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMultiProcessorCount: *v = emu_ts.sms; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)EMU_SMEM_MAX; break;
    default: emu_fail("cudaDeviceGetAttribute(%d) is not emulated", (int)a);
    }
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *f, cudaFuncAttribute a, int v) {
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize) emu_fail("cudaFuncSetAttribute(%d) is not emulated", (int)a);
    if (v < 0 || (size_t)v > EMU_SMEM_MAX) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> g(emu_attr_lock);
    emu_smem_limit[f] = v;
    return cudaSuccess;
}

/* ---------------------------------------------------------------------------
 * Devices, streams, events and memory, for kernels.cu's cuda_* functions
 * (and through them tensor.c's USE_CUDA Dev), comm.c's NCCL backend and the
 * emulated NCCL (emu_stream.h).
 *
 * Settings, read once per process:
 *   EMU_GPUS=n          how many devices cudaGetDeviceCount reports (default 1)
 *   EMU_STREAMS=eager|first-late|rest-late   when streams run (default eager)
 *   EMU_RACECHECK=0     turns the race detector off (default on)
 *   EMU_TRACE_WAITS=1   prints each cudaStreamWaitEvent as it is issued: which
 *                       stream waits for which other stream's op, and how many
 *                       later ops of that stream (queued, not yet done) it
 *                       leaves in flight
 *   EMU_STEP_COUNTS=1   prints, at the end of each outermost NVTX range of a
 *                       thread (train's steps, "step S"), how often that
 *                       thread blocked on the device and allocated inside it
 *                       (see "A step's synchronizations" below)
 *
 * Streams are queues of ops (EmuStreamOp), run in order on the calling
 * thread; there are no worker threads, so every run is deterministic. An
 * eager stream runs an op as soon as it reaches it and the events it waits
 * for are reached: after every enqueue, and after any progress, the eager
 * streams are pumped to a fixpoint. A late stream runs only on demand: a
 * host synchronization, an event query or synchronization, or another
 * stream's wait on one of its events runs it up to the position waited for
 * (a wait demands the event's stream up to the record, recursively). A query
 * (cudaEventQuery, cudaStreamQuery) steps at most one op of the stream, as
 * a GPU progresses while the host polls: a late stream answers "not ready"
 * to the first query of two queued ops, and "ready" once polled enough.
 * EMU_STREAMS=first-late makes the first stream the process creates late
 * (cuda_open's compute stream), rest-late every other one; the legacy
 * default stream 0 runs each op at once, after nothing (it does not drain
 * the other streams, unlike a GPU's legacy stream: keep it simple).
 *
 * With late timing a device-to-host copy into pinned memory fills its
 * destination with 0xFF (NaN) when it is issued, so host code that reads it
 * before synchronizing sees NaN; a host-to-device copy from pinned memory
 * that does not run at once checksums its source when issued and stops the
 * program if the host wrote it before the copy ran. Copies between device
 * and pageable host memory (anything not from cudaMallocHost) complete
 * before they return, as CUDA's do.
 *
 * The race detector keeps vector clocks: each stream's (the ticks of every
 * stream it has seen happen before its current op), the host's (what it has
 * synchronized with), and each event record's (its stream's at the record).
 * An op on stream s ticks s when it starts, after merging the host's clock
 * as it was at the op's enqueue; a wait merges the record's clock; a host
 * synchronization merges the stream's (or the record's) into the host's.
 * Each device or pinned allocation keeps its recent accesses (stream, tick,
 * byte range, read or write, op); an op's accesses are checked before its
 * first step against other streams' records: a write on either side, bytes
 * in common and a tick the op's stream has not seen stop the program ("no
 * event orders them"). A kernel's accesses are its pointer parameters' first
 * bytes (emu.h); copies, memsets and the NCCL ops' own lists are exact. A
 * record is dropped once every live stream and the host have seen it, or
 * when a later ordered access of the same stream kind covers it (a write
 * covering anything, a read covering a read), and cudaFree forgets the
 * allocation's records.
 *
 * Device memory is host memory: cudaMalloc returns 256-byte aligned bytes
 * filled with 0xFF (NaN in fp32 and bf16: a kernel that reads what nobody
 * wrote shows it) between two guard areas of a known pattern, checked by
 * cudaFree, so a kernel that writes past either end of its buffer stops
 * the program with a message. Every live allocation is in a table, so a
 * cudaFree, cudaMemsetAsync or device side of a cudaMemcpyAsync that is
 * not inside one (a host pointer passed as a device pointer, a size past
 * the end) stops it too. cudaMallocHost is host memory the table knows as
 * pinned. cudaFree and cudaFreeHost synchronize every stream first.
 *
 * One process-wide recursive lock guards all of it; a waiter that cannot
 * progress releases it in emu_idle, so another thread (comm.c's watchdog)
 * may query events meanwhile, and its queries drive progress under the lock
 * (a query that finds the lock taken answers "not ready" rather than wait). */

namespace {
constexpr size_t EMU_DEV_GUARD = 256;  /* bytes before and after each allocation */
constexpr unsigned char EMU_DEV_GUARD_BYTE = 0x5A;
constexpr size_t EMU_SHADOW_PRUNE = 32, EMU_SHADOW_MAX = 512;  /* records an allocation keeps */

std::recursive_mutex emu_rt_mutex;
thread_local int emu_rt_depth;  /* this thread's holds of emu_rt_mutex */
struct EmuGuard {
    EmuGuard() {
        emu_rt_mutex.lock();
        emu_rt_depth++;
    }
    ~EmuGuard() {
        emu_rt_depth--;
        emu_rt_mutex.unlock();
    }
};

/* A vector clock: by stream index, the last tick of that stream known to
 * happen before. */
typedef std::vector<uint64_t> EmuClock;
void emu_clock_merge(EmuClock &a, const EmuClock &b) {
    if (a.size() < b.size()) a.resize(b.size(), 0);
    for (size_t i = 0; i < b.size(); i++)
        if (b[i] > a[i]) a[i] = b[i];
}
uint64_t emu_clock_at(const EmuClock &a, int i) { return (size_t)i < a.size() ? a[(size_t)i] : 0; }

struct EmuStream;
/* One cudaEventRecord: the record op's place, and its stream's clock once
 * reached. */
struct EmuRecord {
    EmuStream *s;
    uint64_t seq;
    bool done;
    EmuClock clock;
    uint64_t works;           /* s->works when recorded: the work it stands for */
    std::string last_work;
};
struct EmuEvent {
    std::shared_ptr<EmuRecord> last;  /* the most recent record; null: never recorded (complete) */
};
struct EmuQueued {
    std::unique_ptr<EmuStreamOp> op;
    EmuClock host;  /* the host's clock at the enqueue */
    bool started;
    bool work;      /* not an event record or wait */
};
struct EmuStream {
    int index;      /* 0: the legacy default stream; then in creation order */
    int device;
    bool late;      /* runs only on demand (EMU_STREAMS) */
    bool live;      /* not destroyed (a destroyed stream drains eagerly) */
    bool stepping;  /* an op of it is being stepped: no re-entry */
    std::deque<EmuQueued> q;
    uint64_t enqueued, done;  /* ops so far; the front op is number done + 1 */
    EmuClock clock;
    uint64_t works = 0;       /* ops that do work (not event records or waits) so far */
    uint64_t works_done = 0;  /* and completed */
    std::string last_work;    /* the latest one's name (EMU_TRACE_WAITS, EMU_STEP_COUNTS) */
    uint64_t host_works = 0;  /* works the host has waited for (EMU_STEP_COUNTS) */
};
/* One recent access to an allocation, for the race detector. */
struct EmuShadow {
    int stream;
    uint64_t tick;
    size_t lo, hi;  /* byte offsets in the allocation */
    bool write;
    std::shared_ptr<const std::string> op;
};
struct EmuAlloc {
    size_t bytes;
    int device;  /* -1: pinned host memory (cudaMallocHost) */
    std::vector<EmuShadow> recs;
};

enum { EMU_EAGER, EMU_FIRST_LATE, EMU_REST_LATE };
struct EmuRuntime {
    int timing = EMU_EAGER;
    bool racecheck = true;
    bool trace_waits = false;  /* EMU_TRACE_WAITS=1 */
    int gpus = 1;
    std::vector<EmuStream *> streams;  /* by index; never freed: records point at them */
    EmuClock host;
    std::map<uintptr_t, EmuAlloc> allocs;  /* start -> device or pinned allocation */
    uint64_t completed = 0;                /* ops completed: progress */
};
thread_local int emu_device;  /* cudaSetDevice, per thread as in CUDA */

long emu_env_long(const char *name, long dflt, long lo, long hi) {
    const char *v = getenv(name);
    if (!v) return dflt;
    char *end;
    const long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x < lo || x > hi) emu_fail("%s must be a number from %ld to %ld, not %s", name, lo, hi, v);
    return x;
}

/* The runtime's state, made at the first call (with the settings) and never
 * destroyed (exit may come from any thread, in the middle of anything). */
EmuRuntime &emu_rt(void) {
    static EmuRuntime *rt = [] {
        EmuRuntime *r = new EmuRuntime;
        const char *t = getenv("EMU_STREAMS");
        if (!t || !strcmp(t, "eager")) r->timing = EMU_EAGER;
        else if (!strcmp(t, "first-late")) r->timing = EMU_FIRST_LATE;
        else if (!strcmp(t, "rest-late")) r->timing = EMU_REST_LATE;
        else emu_fail("EMU_STREAMS must be eager, first-late or rest-late, not %s", t);
        r->racecheck = emu_env_long("EMU_RACECHECK", 1, 0, 1) != 0;
        r->trace_waits = emu_env_long("EMU_TRACE_WAITS", 0, 0, 1) != 0;
        r->gpus = (int)emu_env_long("EMU_GPUS", 1, 1, 64);
        r->streams.push_back(new EmuStream{0, 0, false, true, false, {}, 0, 0, {}});
        return r;
    }();
    return *rt;
}

/* ---------------------------------------------------------------------------
 * A step's synchronizations and allocations (EMU_STEP_COUNTS=1). train marks
 * each training step with an NVTX range (main.c through tensor.c's
 * dev_range_push/pop and kernels.cu's cuda_range_*, "step S"; on a GPU nsys
 * and ncu see the same ranges). Inside a thread's outermost range, each call
 * of that thread that makes the host wait for device work it has not waited
 * for yet counts as a synchronization: cudaStreamSynchronize,
 * cudaDeviceSynchronize and cudaEventSynchronize with work queued since the
 * host last waited for that stream (a second wait on an idle stream costs
 * microseconds and is not counted), a copy between the device and pageable
 * host memory (it completes before it returns), cudaFree and cudaFreeHost
 * (which wait for the device); each cudaMalloc, cudaMallocHost, cudaFree and
 * cudaFreeHost counts as an allocation. At the range's end one line goes to
 * stderr, whatever the counts:
 *   emu: device D: step S: N blocking synchronizations, M allocations, K kernels,
 *        C copies and memsets, L NCCL calls[: what; ...]
 * each `what` naming the call and the stream's last op before it; K, C and
 * L count the device work the thread queued in the range (on a GPU each
 * kernel's launch and its gap from the one before are the step's cost
 * beyond the kernels' own times: bench/NOTES.md, "The graph-capture
 * question"). Counting is per thread: comm.c's watchdog only queries
 * events, which never block. */
struct EmuStepCount {
    int depth = 0;          /* NVTX ranges open on this thread */
    std::string name;       /* the outermost one's */
    long syncs = 0, allocs = 0;
    long kernels = 0, copies = 0, nccl = 0;  /* device work it queued: launches, copies and memsets, NCCL calls */
    std::string calls;      /* what was counted, for the line */
};
thread_local EmuStepCount emu_sc;

bool emu_step_counts_on(void) {
    static const bool on = emu_env_long("EMU_STEP_COUNTS", 0, 0, 1) != 0;
    return on;
}

void emu_count(bool alloc, const std::string &what) {
    if (!emu_sc.depth || !emu_step_counts_on()) return;
    (alloc ? emu_sc.allocs : emu_sc.syncs)++;
    if (emu_sc.calls.size() < 4000) emu_sc.calls += (emu_sc.calls.empty() ? ": " : "; ") + what;
}

/* Whether the host waiting for s up to its work number `upto` waits for
 * work it has not waited for yet; from now on it has. */
bool emu_unseen(EmuStream *s, uint64_t upto) {
    const bool unseen = upto > s->host_works;
    if (unseen) s->host_works = upto;
    return unseen;
}

/* emu_unseen for every stream, to all its work (cudaFree's wait). */
bool emu_unseen_all(void) {
    bool unseen = false;
    for (EmuStream *s : emu_rt().streams) unseen |= emu_unseen(s, s->works);
    return unseen;
}

EmuStream *emu_stream(cudaStream_t s) {
    EmuRuntime &rt = emu_rt();
    /* 0, cudaStreamLegacy and cudaStreamPerThread: the legacy default stream */
    if ((uintptr_t)(void *)s <= 2) return rt.streams[0];
    return (EmuStream *)(void *)s;
}

/* The live allocation holding p (device or pinned), or null. */
EmuAlloc *emu_alloc_of(const void *p, uintptr_t *start) {
    EmuRuntime &rt = emu_rt();
    const uintptr_t a = (uintptr_t)p;
    auto it = rt.allocs.upper_bound(a);
    if (it == rt.allocs.begin()) return nullptr;
    --it;
    if (a - it->first >= it->second.bytes && !(a == it->first && it->second.bytes == 0)) return nullptr;
    *start = it->first;
    return &it->second;
}

/* Whether [p, p + n) lies inside one live device allocation. */
bool emu_dev_range(const void *p, size_t n) {
    uintptr_t start;
    EmuAlloc *al = emu_alloc_of(p, &start);
    if (!al) return false;
    return al->device >= 0 && n <= al->bytes - ((uintptr_t)p - start);
}
bool emu_pinned_range(const void *p, size_t n) {
    uintptr_t start;
    EmuAlloc *al = emu_alloc_of(p, &start);
    return al && al->device < 0 && n <= al->bytes - ((uintptr_t)p - start);
}

/* Drops the records every live stream and the host have seen. */
void emu_shadow_prune(EmuAlloc *al) {
    EmuRuntime &rt = emu_rt();
    auto seen = [&](const EmuShadow &r) {
        if (emu_clock_at(rt.host, r.stream) < r.tick) return false;
        for (EmuStream *s : rt.streams)
            if (s->live && s->index != r.stream && emu_clock_at(s->clock, r.stream) < r.tick) return false;
        return true;
    };
    al->recs.erase(std::remove_if(al->recs.begin(), al->recs.end(), seen), al->recs.end());
}

/* The race detector, before an op's first step on s (whose clock has ticked
 * for it): checks each access against the other streams' records, then
 * records it. */
void emu_race_check(EmuStream *s, const EmuStreamOp *op) {
    EmuRuntime &rt = emu_rt();
    if (!rt.racecheck || op->access.empty()) return;
    std::shared_ptr<const std::string> name;
    const uint64_t tick = emu_clock_at(s->clock, s->index);
    for (const EmuAccess &a : op->access) {
        uintptr_t start;
        EmuAlloc *al = a.bytes ? emu_alloc_of(a.p, &start) : nullptr;
        if (!al) continue;  /* not device or pinned memory we know: not ours to check */
        const size_t lo = (uintptr_t)a.p - start, hi = std::min(lo + a.bytes, al->bytes);
        for (const EmuShadow &r : al->recs) {
            if (r.stream == s->index || !(r.write || a.write) || r.hi <= lo || hi <= r.lo) continue;
            if (emu_clock_at(s->clock, r.stream) >= r.tick) continue;
            const size_t o = std::max(lo, r.lo);
            emu_fail("race: %s on stream %d (%s of bytes [%zu, %zu)) and %s on stream %d (%s of bytes [%zu, %zu)) "
                     "touch the %s allocation at %p (%zu bytes; offset %zu in common), and no event orders them "
                     "(the second did not wait for the first)",
                     r.op->c_str(), r.stream, r.write ? "a write" : "a read", r.lo, r.hi, op->name.c_str(), s->index,
                     a.write ? "a write" : "a read", lo, hi,
                     al->device < 0 ? "pinned host" : ("device " + std::to_string(al->device)).c_str(),
                     (void *)start, al->bytes, o);
        }
        if (!name) name = std::make_shared<const std::string>(op->name);
        /* this access covers a record of its own stream (ordered before it) of
         * the same range or less: the older says nothing the newer does not */
        al->recs.erase(std::remove_if(al->recs.begin(), al->recs.end(),
                                      [&](const EmuShadow &r) {
                                          const bool ordered = r.stream == s->index ||
                                                               emu_clock_at(s->clock, r.stream) >= r.tick;
                                          return ordered && lo <= r.lo && r.hi <= hi && (a.write || !r.write);
                                      }),
                       al->recs.end());
        al->recs.push_back(EmuShadow{s->index, tick, lo, hi, a.write, name});
        if (al->recs.size() > EMU_SHADOW_PRUNE) emu_shadow_prune(al);
        if (al->recs.size() > EMU_SHADOW_MAX) al->recs.erase(al->recs.begin());  /* bounded: the oldest goes */
    }
}

/* Starts the front op of s: the host's clock at its enqueue happens before
 * it, it ticks s, and the detector sees its accesses. */
void emu_op_start(EmuStream *s, EmuQueued &e) {
    emu_clock_merge(s->clock, e.host);
    if (s->clock.size() <= (size_t)s->index) s->clock.resize((size_t)s->index + 1, 0);
    s->clock[(size_t)s->index]++;
    e.started = true;
    emu_race_check(s, e.op.get());
}

/* Runs s's ops in order up to number upto, or at most `limit` of them, or
 * until one cannot progress yet. Returns whether any completed. */
bool emu_advance(EmuStream *s, uint64_t upto, long limit = -1) {
    EmuRuntime &rt = emu_rt();
    bool progressed = false;
    while (s->done < upto && !s->stepping && limit != 0) {
        EmuQueued &e = s->q.front();
        if (!e.started) emu_op_start(s, e);
        s->stepping = true;
        const bool complete = e.op->step();
        s->stepping = false;
        if (!complete) break;
        s->works_done += e.work;
        s->q.pop_front();
        s->done++;
        rt.completed++;
        progressed = true;
        if (limit > 0) limit--;
    }
    return progressed;
}

/* Runs the eager streams (and destroyed ones, which drain) as far as they
 * go, to a fixpoint. */
bool emu_pump(void) {
    EmuRuntime &rt = emu_rt();
    bool any = false;
    for (bool p = true; p;) {
        p = false;
        for (size_t i = 1; i < rt.streams.size(); i++) {
            EmuStream *s = rt.streams[i];
            if ((!s->late || !s->live) && s->done < s->enqueued) p |= emu_advance(s, s->enqueued);
        }
        any |= p;
    }
    return any;
}

/* Blocks until done() holds, driving with drive() and the pump; sleeps in
 * emu_idle when nothing progressed. No timeout: ops that need other
 * processes find deadlocks and dead peers themselves. */
std::atomic<int> emu_blocked_threads{0};  /* threads of this process idle inside emu_block */

template <class Drive, class Done> void emu_block(Drive drive, Done done) {
    EmuRuntime &rt = emu_rt();
    bool idle = false;
    for (long round = 0;;) {
        const uint64_t before = rt.completed;
        drive();
        emu_pump();
        if (done()) break;
        if (rt.completed == before) {
            if (!idle) emu_blocked_threads++;
            idle = true;
            emu_idle(round++);
        } else {
            round = 0;
        }
    }
    if (idle) emu_blocked_threads--;
}

/* The host waits for s's ops up to number upto and has then seen them. */
void emu_host_wait(EmuStream *s, uint64_t upto) {
    emu_block([&] { emu_advance(s, upto); }, [&] { return s->done >= upto; });
    emu_clock_merge(emu_rt().host, s->clock);
}

/* Every stream, up to what is queued now (cudaFree, cudaDeviceSynchronize
 * of device `dev`, or of all with -1). */
void emu_host_wait_all(int dev) {
    EmuRuntime &rt = emu_rt();
    std::vector<std::pair<EmuStream *, uint64_t>> w;
    for (EmuStream *s : rt.streams)
        if (dev < 0 || s->index == 0 || s->device == dev) w.push_back({s, s->enqueued});
    emu_block([&] { for (auto &x : w) emu_advance(x.first, x.second); },
              [&] {
                  for (auto &x : w)
                      if (x.first->done < x.second) return false;
                  return true;
              });
    for (auto &x : w) emu_clock_merge(rt.host, x.first->clock);
}

/* Queues op on s; the legacy default stream runs it at once. Returns its
 * number on s. */
uint64_t emu_enqueue(EmuStream *s, EmuStreamOp *op, bool work = true) {
    EmuRuntime &rt = emu_rt();
    if (work) {
        s->works++;
        if (rt.trace_waits || emu_step_counts_on()) s->last_work = op->name;
        if (emu_sc.depth && emu_step_counts_on())
            (!op->name.compare(0, 4, "cuda") ? emu_sc.copies
             : !op->name.compare(0, 4, "nccl") || !op->name.compare(0, 7, "group {") ? emu_sc.nccl
                                                                                      : emu_sc.kernels)++;
    }
    s->q.push_back(EmuQueued{std::unique_ptr<EmuStreamOp>(op), rt.host, false, work});
    const uint64_t seq = ++s->enqueued;
    if (s->index == 0) emu_host_wait(s, seq);
    else emu_pump();
    return seq;
}

/* Whether any queued op, on any stream, touches [p, p + n). */
bool emu_pending_touches(const void *p, size_t n) {
    const uintptr_t a = (uintptr_t)p;
    for (EmuStream *s : emu_rt().streams)
        for (const EmuQueued &e : s->q)
            for (const EmuAccess &x : e.op->access)
                if ((uintptr_t)x.p < a + n && a < (uintptr_t)x.p + x.bytes) return true;
    return false;
}

uint64_t emu_checksum(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ull;  /* FNV-1a */
    const unsigned char *c = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

const char *emu_kind_name(cudaMemcpyKind k) {
    switch (k) {
    case cudaMemcpyHostToDevice: return "H2D";
    case cudaMemcpyDeviceToHost: return "D2H";
    case cudaMemcpyDeviceToDevice: return "D2D";
    case cudaMemcpyHostToHost: return "H2H";
    default: return "?";
    }
}

/* A copy of `height` rows of `width` bytes (one row: a plain copy). A
 * pinned source checksummed at issue (sum_n > 0) must be unchanged when it
 * runs. */
struct EmuCopyOp : EmuStreamOp {
    unsigned char *dst;
    const unsigned char *src;
    size_t width, height, dpitch, spitch;
    size_t sum_n = 0;
    uint64_t sum = 0;
    int stream = 0;
    bool step() override {
        if (sum_n && emu_checksum(src, sum_n) != sum)
            emu_fail("the host wrote pinned buffer %p (%zu bytes) while %s from it was queued on stream %d, "
                     "with no synchronization between", (const void *)src, sum_n, name.c_str(), stream);
        for (size_t r = 0; r < height; r++) memmove(dst + r * dpitch, src + r * spitch, width);
        return true;
    }
};
struct EmuMemsetOp : EmuStreamOp {
    void *p;
    int v;
    size_t n;
    bool step() override {
        memset(p, v, n);
        return true;
    }
};
/* cudaEventRecord: the record is reached, with this stream's clock. */
struct EmuRecordOp : EmuStreamOp {
    EmuStream *s;
    std::shared_ptr<EmuRecord> rec;
    bool step() override {
        rec->clock = s->clock;
        rec->done = true;
        return true;
    }
};
/* cudaStreamWaitEvent: demands the record's stream up to it, then what
 * happened before the record happens before this stream's next op. */
struct EmuWaitOp : EmuStreamOp {
    EmuStream *s;
    std::shared_ptr<EmuRecord> rec;
    bool step() override {
        if (!rec->done) emu_advance(rec->s, rec->seq);
        if (!rec->done) return false;
        emu_clock_merge(s->clock, rec->clock);
        return true;
    }
};

/* Queues a copy of `height` rows on s, with the pinned-memory rules of the
 * header: a late D2H into pinned memory shows NaN until it runs, a queued
 * H2D from pinned memory is checksummed, and one with pageable host memory
 * completes before this returns. */
cudaError_t emu_copy(const char *call, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                     size_t height, cudaMemcpyKind kind, cudaStream_t stream) {
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyHostToHost && !dst_dev && !src_dev) emu_fail("%s: kind %d is not emulated", call, (int)kind);
    if (width > dpitch && height > 1) emu_fail("%s: width %zu beyond the destination pitch %zu", call, width, dpitch);
    if (width > spitch && height > 1) emu_fail("%s: width %zu beyond the source pitch %zu", call, width, spitch);
    if (!width || !height) return cudaSuccess;
    const size_t dspan = (height - 1) * dpitch + width, sspan = (height - 1) * spitch + width;
    if (dst_dev && !emu_dev_range(dst, dspan))
        emu_fail("%s(%s): destination %p + %zu bytes not inside one device allocation", call, emu_kind_name(kind), dst, dspan);
    if (src_dev && !emu_dev_range(src, sspan))
        emu_fail("%s(%s): source %p + %zu bytes not inside one device allocation", call, emu_kind_name(kind), src, sspan);
    EmuStream *s = emu_stream(stream);
    EmuCopyOp *op = new EmuCopyOp;
    op->dst = (unsigned char *)dst;
    op->src = (const unsigned char *)src;
    op->width = width;
    op->height = height;
    op->dpitch = dpitch;
    op->spitch = spitch;
    op->stream = s->index;
    char nm[160];
    snprintf(nm, sizeof nm, "%s(%s, %zu bytes%s) #%llu", call, emu_kind_name(kind), width * height,
             height > 1 ? " in rows" : "", (unsigned long long)s->enqueued + 1);
    op->name = nm;
    for (size_t r = 0; r < height; r++) {
        op->access.push_back(EmuAccess{(const unsigned char *)src + r * spitch, width, false});
        op->access.push_back(EmuAccess{(unsigned char *)dst + r * dpitch, width, true});
    }
    const bool host_dst = !dst_dev, host_src = !src_dev;
    const bool pageable = (host_dst && !emu_pinned_range(dst, dspan)) || (host_src && !emu_pinned_range(src, sspan));
    const bool queued = s->index != 0 && (s->late || s->done < s->enqueued);
    if (!pageable && queued && host_src && height == 1) {
        op->sum_n = width;
        op->sum = emu_checksum(src, width);
    }
    if (!pageable && s->late && host_dst && height == 1 && !emu_pending_touches(dst, width))
        memset(dst, 0xFF, width);  /* in flight: NaN until it lands */
    if (pageable) emu_count(false, op->name + " with pageable host memory");
    const uint64_t seq = emu_enqueue(s, op);
    if (pageable) {
        emu_host_wait(s, seq);
        emu_unseen(s, s->works);
    }
    return cudaSuccess;
}
}  // namespace

/* emu_stream.h */
void emu_stream_enqueue(cudaStream_t s, EmuStreamOp *op) {
    EmuGuard g;
    emu_enqueue(emu_stream(s), op);
}
int emu_current_device(void) { return emu_device; }
bool emu_host_blocked(void) { return emu_blocked_threads.load() > 0; }
int emu_dev_owner(const void *p, size_t bytes) {
    EmuGuard g;
    uintptr_t start;
    EmuAlloc *al = emu_alloc_of(p, &start);
    if (!al || al->device < 0 || bytes > al->bytes - ((uintptr_t)p - start)) return -1;
    return al->device;
}
void emu_idle(long round) {
    const int depth = emu_rt_depth;
    for (int i = 0; i < depth; i++) emu_rt_mutex.unlock();
    emu_rt_depth = 0;
    const long us = round < 10 ? 20 : round < 100 ? 200 : 1000;
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, nullptr);
    for (int i = 0; i < depth; i++) emu_rt_mutex.lock();
    emu_rt_depth = depth;
}
std::string emu_stream_describe(cudaStream_t stream) {
    EmuGuard g;
    const EmuStream *s = emu_stream(stream);
    std::string d = "stream " + std::to_string(s->index) + " (device " + std::to_string(s->device) +
                    (s->late ? ", late" : ", eager") + "): " + std::to_string(s->q.size()) + " ops queued";
    if (!s->q.empty()) d += ", first " + s->q.front().op->name + (s->q.front().started ? " (started)" : "");
    return d;
}

cudaError_t cudaGetDeviceCount(int *n) {
    EmuGuard g;
    *n = emu_rt().gpus;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = emu_device;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    EmuGuard g;
    if (d < 0 || d >= emu_rt().gpus) return cudaErrorInvalidDevice;
    emu_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    {
        EmuGuard g;
        if (d < 0 || d >= emu_rt().gpus) return cudaErrorInvalidDevice;
    }
    emu_settings();
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CPU emulation of %s (%d SMs, device %d), not a GPU",
             emu_ts.sm90 ? "sm_90a" : "sm_80", emu_ts.sms, d);
    p->major = emu_ts.sm90 ? 9 : 8;
    p->minor = 0;
    p->multiProcessorCount = emu_ts.sms;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->sharedMemPerBlock = EMU_SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = EMU_SMEM_MAX;
    p->totalGlobalMem = (size_t)16 << 30;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int) {
    EmuGuard g;
    EmuRuntime &rt = emu_rt();
    const int index = (int)rt.streams.size();
    const bool late = rt.timing == EMU_FIRST_LATE ? index == 1 : rt.timing == EMU_REST_LATE ? index > 1 : false;
    EmuStream *s = new EmuStream{index, emu_device, late, true, false, {}, 0, 0, {}};
    rt.streams.push_back(s);
    *out = (cudaStream_t)(void *)s;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
/* The stream's queued work still runs (eagerly from now on), as on a GPU. */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    EmuGuard g;
    EmuStream *s = emu_stream(stream);
    if (s->index == 0) return cudaErrorInvalidResourceHandle;
    s->live = false;
    emu_pump();
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    EmuGuard g;
    EmuStream *s = emu_stream(stream);
    if (emu_unseen(s, s->works))
        emu_count(false, "cudaStreamSynchronize(stream " + std::to_string(s->index) + ", after " + s->last_work + ")");
    emu_host_wait(s, s->enqueued);
    return cudaSuccess;
}
/* One step of progress (see the header), then whether all is done. */
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    std::unique_lock<std::recursive_mutex> l(emu_rt_mutex, std::try_to_lock);
    if (!l.owns_lock()) return cudaErrorNotReady;
    emu_rt_depth++;
    EmuStream *s = emu_stream(stream);
    emu_advance(s, s->enqueued, 1);
    emu_pump();
    const bool done = s->done == s->enqueued;
    if (done) emu_clock_merge(emu_rt().host, s->clock);
    emu_rt_depth--;
    return done ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaDeviceSynchronize(void) {
    EmuGuard g;
    bool unseen = false;
    for (EmuStream *s : emu_rt().streams)
        if (s->device == emu_device) unseen |= emu_unseen(s, s->works);
    if (unseen) emu_count(false, "cudaDeviceSynchronize");
    emu_host_wait_all(emu_device);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int) {
    EmuGuard g;
    *e = (cudaEvent_t)(void *)new EmuEvent;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
/* Records queued or in waits hold their own references. */
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    EmuGuard g;
    delete (EmuEvent *)(void *)e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    EmuGuard g;
    EmuEvent *e = (EmuEvent *)(void *)event;
    EmuStream *s = emu_stream(stream);
    EmuRecordOp *op = new EmuRecordOp;
    op->s = s;
    op->rec = std::make_shared<EmuRecord>(EmuRecord{s, s->enqueued + 1, false, {}, s->works, s->last_work});
    op->name = "cudaEventRecord #" + std::to_string(s->enqueued + 1);
    e->last = op->rec;
    emu_enqueue(s, op, false);
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
    EmuGuard g;
    EmuEvent *e = (EmuEvent *)(void *)event;
    if (!e->last) return cudaSuccess;  /* never recorded: complete */
    EmuStream *s = emu_stream(stream);
    EmuWaitOp *op = new EmuWaitOp;
    op->s = s;
    op->rec = e->last;
    op->name = "cudaStreamWaitEvent(stream " + std::to_string(e->last->s->index) + " #" +
               std::to_string(e->last->seq) + ") #" + std::to_string(s->enqueued + 1);
    const EmuRecord &rec = *e->last;
    if (emu_rt().trace_waits && rec.works) {   /* which work this wait is for, and what it leaves running */
        const uint64_t after = rec.s->works - std::max(rec.works, rec.s->works_done);
        fprintf(stderr, "emu: wait: stream %d waits for stream %d through %s, leaving %llu later op%s of it in flight\n",
                s->index, rec.s->index, rec.last_work.c_str(), (unsigned long long)after, after == 1 ? "" : "s");
    }
    emu_enqueue(s, op, false);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    EmuGuard g;
    const std::shared_ptr<EmuRecord> r = ((EmuEvent *)(void *)event)->last;
    if (r && emu_unseen(r->s, r->works))
        emu_count(false, "cudaEventSynchronize(stream " + std::to_string(r->s->index) + ", after " + r->last_work + ")");
    if (!r) return cudaSuccess;
    emu_block([&] { emu_advance(r->s, r->seq); }, [&] { return r->done; });
    emu_clock_merge(emu_rt().host, r->clock);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
    std::unique_lock<std::recursive_mutex> l(emu_rt_mutex, std::try_to_lock);
    if (!l.owns_lock()) return cudaErrorNotReady;
    emu_rt_depth++;
    const std::shared_ptr<EmuRecord> r = ((EmuEvent *)(void *)event)->last;
    if (r && !r->done) {
        emu_advance(r->s, r->seq, 1);
        emu_pump();
    }
    const bool done = !r || r->done;
    if (r && done) emu_clock_merge(emu_rt().host, r->clock);
    emu_rt_depth--;
    return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    emu_count(true, "cudaMalloc(" + std::to_string(bytes) + " bytes)");
    const size_t body = (bytes + 255) / 256 * 256;
    unsigned char *b = (unsigned char *)aligned_alloc(256, body + 2 * EMU_DEV_GUARD);
    if (!b) return cudaErrorMemoryAllocation;
    memset(b, EMU_DEV_GUARD_BYTE, EMU_DEV_GUARD);
    memset(b + EMU_DEV_GUARD, 0xFF, bytes);  /* uninitialised: NaN */
    memset(b + EMU_DEV_GUARD + bytes, EMU_DEV_GUARD_BYTE, body - bytes + EMU_DEV_GUARD);
    *p = b + EMU_DEV_GUARD;
    EmuGuard g;
    emu_rt().allocs[(uintptr_t)*p] = EmuAlloc{bytes, emu_device, {}};
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    size_t bytes;
    {
        EmuGuard g;
        EmuRuntime &rt = emu_rt();
        auto it = rt.allocs.find((uintptr_t)p);
        if (it == rt.allocs.end() || it->second.device < 0) emu_fail("cudaFree(%p): not a live device allocation", p);
        emu_count(true, "cudaFree(" + std::to_string(it->second.bytes) + " bytes)");
        if (emu_unseen_all()) emu_count(false, "cudaFree(" + std::to_string(it->second.bytes) + " bytes), which waits for the device");
        emu_host_wait_all(-1);  /* as CUDA's cudaFree: the device's work first */
        it = rt.allocs.find((uintptr_t)p);
        bytes = it->second.bytes;
        rt.allocs.erase(it);
    }
    unsigned char *b = (unsigned char *)p - EMU_DEV_GUARD;
    const size_t body = (bytes + 255) / 256 * 256;
    for (size_t i = 0; i < EMU_DEV_GUARD; i++)
        if (b[i] != EMU_DEV_GUARD_BYTE)
            emu_fail("a store %zu bytes before a %zu-byte device buffer (found at its cudaFree)",
                     EMU_DEV_GUARD - i, bytes);
    for (size_t i = EMU_DEV_GUARD + bytes; i < body + 2 * EMU_DEV_GUARD; i++)
        if (b[i] != EMU_DEV_GUARD_BYTE)
            emu_fail("a store %zu bytes past the end of a %zu-byte device buffer (found at its cudaFree)",
                     i - EMU_DEV_GUARD - bytes, bytes);
    free(b);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) {
    emu_count(true, "cudaMallocHost(" + std::to_string(bytes) + " bytes)");
    *p = malloc(bytes ? bytes : 1);
    if (!*p) return cudaErrorMemoryAllocation;
    EmuGuard g;
    emu_rt().allocs[(uintptr_t)*p] = EmuAlloc{bytes ? bytes : 1, -1, {}};
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    {
        EmuGuard g;
        EmuRuntime &rt = emu_rt();
        auto it = rt.allocs.find((uintptr_t)p);
        if (it == rt.allocs.end() || it->second.device >= 0) emu_fail("cudaFreeHost(%p): not from cudaMallocHost", p);
        emu_count(true, "cudaFreeHost(" + std::to_string(it->second.bytes) + " bytes)");
        if (emu_unseen_all()) emu_count(false, "cudaFreeHost, which waits for the device");
        emu_host_wait_all(-1);
        rt.allocs.erase((uintptr_t)p);
    }
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t stream) {
    EmuGuard g;
    if (!emu_dev_range(p, n)) emu_fail("cudaMemsetAsync(%p, %zu bytes): not inside one device allocation", p, n);
    if (!n) return cudaSuccess;
    EmuStream *s = emu_stream(stream);
    EmuMemsetOp *op = new EmuMemsetOp;
    op->p = p;
    op->v = v;
    op->n = n;
    op->name = "cudaMemsetAsync(" + std::to_string(n) + " bytes) #" + std::to_string(s->enqueued + 1);
    op->access.push_back(EmuAccess{p, n, true});
    emu_enqueue(s, op);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
    EmuGuard g;
    return emu_copy("cudaMemcpyAsync", dst, n, src, n, n, 1, kind, stream);
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
    EmuGuard g;
    return emu_copy("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind, stream);
}
/* A __device__ variable is a host object under the emulation: a D2H copy
 * from it (not an allocation the detector knows). */
cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t n, size_t offset, cudaMemcpyKind kind,
                                      cudaStream_t stream) {
    if (kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDefault)
        emu_fail("cudaMemcpyFromSymbolAsync: kind %d is not emulated", (int)kind);
    EmuGuard g;
    EmuStream *s = emu_stream(stream);
    EmuCopyOp *op = new EmuCopyOp;
    op->dst = (unsigned char *)dst;
    op->src = (const unsigned char *)symbol + offset;
    op->width = op->dpitch = op->spitch = n;
    op->height = 1;
    op->stream = s->index;
    op->name = "cudaMemcpyFromSymbolAsync(" + std::to_string(n) + " bytes) #" + std::to_string(s->enqueued + 1);
    op->access.push_back(EmuAccess{dst, n, true});
    const bool pinned = emu_pinned_range(dst, n);
    if (pinned && s->late && !emu_pending_touches(dst, n)) memset(dst, 0xFF, n);
    if (!pinned) emu_count(false, op->name + " to pageable host memory");
    const uint64_t seq = emu_enqueue(s, op);
    if (!pinned) emu_host_wait(s, seq);
    return cudaSuccess;
}

/* NVTX's ranges, as far as train uses them: they open and close a step's
 * count (above). Other tools' meanings (nesting shown in a timeline) need
 * nothing here. */
int nvtxRangePushA(const char *message) {
    if (emu_sc.depth++ == 0) {
        emu_sc.name = message ? message : "";
        emu_sc.syncs = emu_sc.allocs = emu_sc.kernels = emu_sc.copies = emu_sc.nccl = 0;
        emu_sc.calls.clear();
    }
    return emu_sc.depth - 1;
}
int nvtxRangePop(void) {
    if (!emu_sc.depth) return -1;
    if (--emu_sc.depth == 0 && emu_step_counts_on())
        fprintf(stderr, "emu: device %d: %s: %ld blocking synchronization%s, %ld allocation%s, %ld kernels, %ld copies "
                "and memsets, %ld NCCL calls%s\n", emu_device, emu_sc.name.c_str(), emu_sc.syncs,
                emu_sc.syncs == 1 ? "" : "s", emu_sc.allocs, emu_sc.allocs == 1 ? "" : "s", emu_sc.kernels,
                emu_sc.copies, emu_sc.nccl, emu_sc.calls.c_str());
    return emu_sc.depth;
}

/* cuTensorMapEncodeTiled, as far as matmul.cu uses it: rank 2, bfloat16,
 * no interleave, element strides 1, swizzle none or 128 bytes (with a
 * 128-byte box row). It checks the driver's documented rules (16-byte
 * aligned address and row pitch, dimensions 1..2^32, boxes 1..256 with a
 * 16-byte multiple of a row, at most the swizzle span) and refuses the rest
 * with CUDA_ERROR_INVALID_VALUE, as the driver does, or stops where the
 * emulation does not go. */
static CUresult emu_encode_tiled(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank, void *addr,
                                 const cuuint64_t *dim, const cuuint64_t *strides, const cuuint32_t *box,
                                 const cuuint32_t *estr, CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill oob) {
    if (type != CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 || rank != 2 || il != CU_TENSOR_MAP_INTERLEAVE_NONE ||
        (sw != CU_TENSOR_MAP_SWIZZLE_NONE && sw != CU_TENSOR_MAP_SWIZZLE_128B) || oob != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        emu_fail("cuTensorMapEncodeTiled: only rank 2 bfloat16, no interleave, swizzle none or 128B and zero fill are emulated");
    if (!map || ((uintptr_t)map & 63) || !addr || ((uintptr_t)addr & 15)) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < 2; i++) {
        if (dim[i] == 0 || dim[i] > (1ull << 32)) return CUDA_ERROR_INVALID_VALUE;
        if (box[i] == 0 || box[i] > 256 || estr[i] != 1) return CUDA_ERROR_INVALID_VALUE;
    }
    if (strides[0] % 16 || strides[0] >= (1ull << 40) || strides[0] < dim[0] * 2) return CUDA_ERROR_INVALID_VALUE;
    if ((box[0] * 2) % 16) return CUDA_ERROR_INVALID_VALUE;
    if (sw == CU_TENSOR_MAP_SWIZZLE_128B && box[0] * 2 > 128) return CUDA_ERROR_INVALID_VALUE;
    if (sw == CU_TENSOR_MAP_SWIZZLE_128B && box[0] * 2 != 128)
        emu_fail("cuTensorMapEncodeTiled: a 128B-swizzled box row of %u bytes (only 128 is emulated)", box[0] * 2);
    memset(map, 0, sizeof *map);
    EmuTensorMap *t = (EmuTensorMap *)(void *)map;
    t->magic = EMU_MAP_MAGIC;
    t->base = (const unsigned char *)addr;
    t->dim[0] = dim[0];
    t->dim[1] = dim[1];
    t->pitch = strides[0];
    t->box[0] = box[0];
    t->box[1] = box[1];
    t->swizzle128 = sw == CU_TENSOR_MAP_SWIZZLE_128B;
    return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version, unsigned long long,
                                             cudaDriverEntryPointQueryResult *q) {
    if (strcmp(symbol, "cuTensorMapEncodeTiled") || version < 12000) {
        *fn = nullptr;
        if (q) *q = cudaDriverEntryPointSymbolNotFound;
        return cudaSuccess;
    }
    *fn = (void *)&emu_encode_tiled;
    if (q) *q = cudaDriverEntryPointSuccess;
    return cudaSuccess;
}

/* ---------------------------------------------------------------------------
 * wgmma with A from registers (attention_sm90.cu's O += P V; emu.h says
 * what is checked). Every issue takes a record from a ring of
 * EMU_RS_RING: each thread's pointer to its four A registers and their
 * values at issue. The warpgroup's EmuWgmma carries the record's index in
 * its A descriptor (EMU_RS_MARK sets bits 52-61, which no real descriptor
 * may: emu_desc refuses them), so that emu_wgmma_run, wherever the
 * ordinary commit / wait machinery calls it, finds the record here. */
namespace {
constexpr int EMU_RS_RING = 256;
constexpr uint64_t EMU_RS_MARK = 1023ull << 52;
struct EmuRsRecord {
    const uint32_t *a[128];
    uint32_t issued[128][4];
    bool pending;
};
thread_local EmuRsRecord emu_rs_ring[EMU_RS_RING];
thread_local unsigned emu_rs_next;
thread_local std::map<const EmuWarpgroup *, unsigned> emu_rs_open;  /* the record each warpgroup is filling */
}  // namespace

void emu_wgmma_rs(const uint32_t *a, uint64_t db, int tb, int n, float *d) {
    if (n % 8 || n < 8 || n > 256) emu_fail("wgmma: n %d", n);
    EmuWarpgroup *g = emu_my_wg(EMU_WG_MMA);
    const int t = emu_self()->linear % 128;
    if (g->arrived == 0) {  /* the first thread of this issue takes a record */
        const unsigned idx = emu_rs_next++ % EMU_RS_RING;
        if (emu_rs_ring[idx].pending)
            emu_fail("wgmma with A from registers: more than %d in flight (no wgmma.wait_group retires them)", EMU_RS_RING);
        emu_rs_ring[idx].pending = true;
        emu_rs_open[g] = idx;
    }
    const unsigned idx = emu_rs_open[g];
    EmuRsRecord &r = emu_rs_ring[idx];
    r.a[t] = a;
    memcpy(r.issued[t], a, sizeof r.issued[t]);
    g->a[t] = EMU_RS_MARK | idx;
    g->b[t] = db;
    g->arg[t] = 0 | tb << 1 | n << 2;
    g->d[t] = d;
    emu_wg_arrive(g, EMU_WG_MMA);
}

bool emu_wgmma_rs_run(const EmuWgmma &op) {
    if ((op.da & EMU_RS_MARK) != EMU_RS_MARK) return false;
    EmuRsRecord &r = emu_rs_ring[op.da & (EMU_RS_RING - 1)];
    if (!r.pending) emu_fail("wgmma with A from registers: a record run twice (emulation bug)");
    r.pending = false;
    const EmuDesc gb = emu_desc(op.db, "B");
    static thread_local float A[64][16];
    for (int t = 0; t < 128; t++) {
        if (memcmp(r.a[t], r.issued[t], sizeof r.issued[t]))
            emu_fail("wgmma with A from registers: thread %d of the warpgroup changed its A registers before "
                     "the wgmma.wait_group that retires it (the hardware may read either value)", t);
        const int w = t >> 5, l = t & 31, gr = l >> 2, tq = l & 3;
        for (int i = 0; i < 4; i++) {
            const int row = 16 * w + gr + 8 * (i & 1), col = 2 * tq + 8 * (i >> 1);
            const uint32_t v = r.a[t][i];
            const uint32_t lo = (v & 0xFFFFu) << 16, hi = v & 0xFFFF0000u;
            memcpy(&A[row][col], &lo, 4);
            memcpy(&A[row][col + 1], &hi, 4);
        }
    }
    emu_wgmma_acc(A, gb, op);
    return true;
}
