/* test/emu/emu_stream.h: the emulated CUDA runtime's asynchronous streams,
 * as seen by the other emulated libraries (emu_nccl.cpp) that put work on
 * them. emu_rt.cpp implements it; emu.h's launches, and the runtime's own
 * copies, memsets and event waits, are ops of the same kind.
 *
 * A stream is a queue run in order. An op is stepped when the stream
 * reaches it, and again while step() returns false (an op that needs other
 * processes, a collective, says "not yet" rather than blocking). When a
 * stream runs is the timing (EMU_STREAMS, see emu_rt.cpp): as soon as it
 * can, or only when something waits for it. Whatever the timing, an op
 * never starts before the ops queued ahead of it on its stream completed,
 * nor before the events it waits for.
 *
 * Before an op's first step the runtime checks its accesses against what
 * other streams did to the same bytes (the race detector: a write and
 * another access from two streams with no event ordering them stops the
 * program, naming both ops and the buffer).
 *
 * Thread safety: every entry point of the emulated runtime, these included,
 * takes one process-wide lock; a blocking wait releases it while it sleeps,
 * so another thread (comm.c's watchdog) may query events meanwhile.
 */
#ifndef EMU_STREAM_H
#define EMU_STREAM_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <string>
#include <vector>

/* A range of device memory (or of pinned host memory) an op reads or writes. */
struct EmuAccess {
    const void *p;
    size_t bytes;
    bool write;
};

struct EmuStreamOp {
    virtual ~EmuStreamOp() {}
    /* Does the work, or as much of it as can be done now; true when complete.
     * Must not block: return false and be stepped again. May call emu_fail. */
    virtual bool step() = 0;
    /* "ncclAllReduce(count 1024, float32) on comm 3 #12": for the detector's
     * messages and emu_stream_describe. */
    std::string name;
    std::vector<EmuAccess> access;
};

/* Queues op on stream s (0: the legacy default stream, run at once) and
 * takes ownership of it. Depending on the timing it may run before this
 * returns. */
void emu_stream_enqueue(cudaStream_t s, EmuStreamOp *op);

/* The device the calling thread has selected (cudaSetDevice), and the one a
 * device allocation was made on (-1: p is not inside a live device
 * allocation of at least `bytes` from p). */
int emu_current_device(void);
int emu_dev_owner(const void *p, size_t bytes);

/* One line on stream s, for messages (a deadlock's): its index, device and
 * timing, how many ops are queued, and the first by name. */
std::string emu_stream_describe(cudaStream_t s);

/* Whether a thread of this process is inside a blocking wait (a stream or
 * event synchronization, cudaFree) that has already found nothing to run:
 * the host can issue nothing until another process moves. The emulated
 * NCCL counts a deadlock only among ranks whose hosts are so blocked (a rank
 * still computing may yet issue what its peers wait for, on another stream). */
bool emu_host_blocked(void);

/* A waiter that cannot progress sleeps through this (a short, growing pause;
 * the runtime's lock released meanwhile). round counts the waits so far. */
void emu_idle(long round);

#endif
