/* test/test_streams_emu.cpp: the emulated runtime's asynchronous streams
 * (test/emu/emu_rt.cpp, emu_stream.h) proved with deliberate bugs. Two
 * streams, A (created first: cuda_open's compute stream in the training
 * program) and B; a kernel on A produces a buffer that a copy on B
 * consumes, and A then overwrites it (the pattern of a gradient handed to
 * a comm stream and rewritten by the next step):
 *  - with events both ways the values are right in every timing;
 *  - without them the race detector stops the program (a child process,
 *    its message and exit status checked);
 *  - without them and with the detector off (EMU_RACECHECK=0) the values
 *    are wrong in the late timings (first-late: B reads before A wrote;
 *    rest-late: B reads after A's second write);
 * and the timings' other promises: a late D2H read early shows NaN, a
 * pinned H2D source written before the copy ran stops the program,
 * cudaEventQuery says not-ready for a late stream and ready after a
 * synchronization, cudaFree synchronizes, pageable copies complete at
 * once, cudaMemcpy2DAsync keeps pitches, an op that needs several steps
 * is stepped, and EMU_GPUS selects devices. test/test_emu.sh runs it under
 * EMU_STREAMS=eager, first-late and rest-late; the timing is in each name.
 */
#include "emu.h"
#include "test/check.h"
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace {

constexpr int N = 256;

void fill(float *x, float v, int n) {
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += (int)(gridDim.x * blockDim.x)) x[i] = v;
}

void launch_fill(float *x, float v, cudaStream_t s) { fill % emu_config("fill", dim3(2), dim3(64), 0, s)(x, v, N); }

const char *timing(void) {
    const char *t = getenv("EMU_STREAMS");
    return t ? t : "eager";
}
/* The stream that runs late in this timing (null: none). */
cudaStream_t late_stream(cudaStream_t a, cudaStream_t b) {
    const std::string t = timing();
    return t == "first-late" ? a : t == "rest-late" ? b : nullptr;
}

struct Pair {
    cudaStream_t a, b;
    float *x, *y;
};
/* The process's first two streams (the timings pick by creation order). */
Pair pair_open(void) {
    Pair p;
    cudaStreamCreateWithFlags(&p.a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&p.b, cudaStreamNonBlocking);
    cudaMalloc((void **)&p.x, N * sizeof(float));
    cudaMalloc((void **)&p.y, N * sizeof(float));
    return p;
}

/* A writes x = 3; B copies x to y; A writes x = 5. With events, B's copy
 * sees 3. Returns y[0] and y[N-1] as the host reads them afterwards. */
void produce_consume(const Pair &p, bool events, float out[2]) {
    launch_fill(p.x, 1.0f, p.a);
    launch_fill(p.y, 0.0f, p.a);
    cudaStreamSynchronize(p.a);
    cudaEvent_t produced, consumed;
    cudaEventCreateWithFlags(&produced, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&consumed, cudaEventDisableTiming);
    launch_fill(p.x, 3.0f, p.a);
    if (events) {
        cudaEventRecord(produced, p.a);
        cudaStreamWaitEvent(p.b, produced, 0);
    }
    cudaMemcpyAsync(p.y, p.x, N * sizeof(float), cudaMemcpyDeviceToDevice, p.b);
    if (events) {
        cudaEventRecord(consumed, p.b);
        cudaStreamWaitEvent(p.a, consumed, 0);
    }
    launch_fill(p.x, 5.0f, p.a);
    cudaDeviceSynchronize();
    float h[N];
    cudaMemcpyAsync(h, p.y, sizeof h, cudaMemcpyDeviceToHost, p.a);  /* pageable: done on return */
    out[0] = h[0];
    out[1] = h[N - 1];
}

/* Runs this program as `child CASE` with one more setting, collecting its
 * output; returns its exit status (-1: killed). */
int run_child(const char *argv0, const char *which, const char *setting, std::string *out) {
    int fd[2];
    if (pipe(fd)) return -2;
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        if (setting) putenv((char *)setting);
        execl("/proc/self/exe", argv0, "child", which, (char *)nullptr);
        _exit(127);
    }
    close(fd[1]);
    char buf[4096];
    ssize_t k;
    while ((k = read(fd[0], buf, sizeof buf)) > 0) out->append(buf, (size_t)k);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int child(const char *which) {
    const std::string w = which;
    if (w == "racy") {
        float y[2];
        produce_consume(pair_open(), false, y);
        printf("y %g %g\n", y[0], y[1]);
        return 0;
    }
    if (w == "pinned-h2d") {
        Pair p = pair_open();
        float *h;
        cudaMallocHost((void **)&h, N * sizeof(float));
        for (int i = 0; i < N; i++) h[i] = 7.0f;
        cudaStream_t late = late_stream(p.a, p.b);
        cudaMemcpyAsync(p.x, h, N * sizeof(float), cudaMemcpyHostToDevice, late ? late : p.a);
        h[3] = 8.0f;  /* the bug: the copy may not have read h yet */
        cudaDeviceSynchronize();
        printf("no stop\n");
        return 0;
    }
    return 2;
}

struct CustomOp : EmuStreamOp {
    int *steps;
    bool step() override { return ++*steps >= 4; }
};

}  // namespace

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "child")) return child(argv[2]);
    Checks c = {0, 0, 0};
    const std::string t = timing();
    const bool lates = t != "eager";
    char name[160];
#define NAME(s) (snprintf(name, sizeof name, "streams %s (cpu emulation, EMU_STREAMS=%s)", s, t.c_str()), name)

    /* (a) with events both ways: 3 in every timing */
    const Pair p = pair_open();
    float y[2];
    produce_consume(p, true, y);
    check(&c, y[0] == 3.0f && y[1] == 3.0f, NAME("produce-consume with events"), "y = %g, %g (want 3)", y[0], y[1]);

    /* (b) without: the detector stops the program, naming both ops */
    std::string out;
    int rc = run_child(argv[0], "racy", nullptr, &out);
    const bool named = out.find("no event orders them") != std::string::npos &&
                       out.find("fill") != std::string::npos && out.find("cudaMemcpyAsync(D2D") != std::string::npos;
    check(&c, rc == 1 && named, NAME("race detected without events"), "exit %d, message: %s", rc,
          out.substr(0, out.find('\n')).c_str());

    /* (c) without, detector off: wrong values where a stream runs late */
    out.clear();
    rc = run_child(argv[0], "racy", "EMU_RACECHECK=0", &out);
    float r0 = -1, r1 = -1;
    sscanf(out.c_str(), "y %f %f", &r0, &r1);
    const bool right = r0 == 3.0f && r1 == 3.0f;
    check(&c, rc == 0 && right != lates, NAME("race without detector"), "exit %d, y = %g, %g (%s in this timing)", rc, r0,
          r1, lates ? "wrong wanted" : "right by luck");

    /* a D2H into pinned memory read before synchronizing: NaN if late */
    {
        cudaStream_t late = late_stream(p.a, p.b), s = late ? late : p.a;
        float *h;
        cudaMallocHost((void **)&h, N * sizeof(float));
        launch_fill(p.x, 4.0f, s);
        cudaMemcpyAsync(h, p.x, N * sizeof(float), cudaMemcpyDeviceToHost, s);
        const float early = h[0];
        cudaStreamSynchronize(s);
        check(&c, (lates ? isnan(early) : early == 4.0f) && h[0] == 4.0f, NAME("pinned D2H read early"),
              "before the sync %g, after %g", early, h[0]);

        /* cudaEventQuery: not ready on a late stream until polled or synced */
        cudaEvent_t e;
        cudaEventCreate(&e);
        launch_fill(p.x, 6.0f, s);
        launch_fill(p.y, 6.0f, s);
        cudaEventRecord(e, s);
        const cudaError_t q0 = cudaEventQuery(e);
        cudaStreamSynchronize(s);
        const cudaError_t q1 = cudaEventQuery(e);
        check(&c, q0 == (lates ? cudaErrorNotReady : cudaSuccess) && q1 == cudaSuccess, NAME("event query"),
              "before the sync %s, after %s", q0 == cudaSuccess ? "ready" : "not ready", q1 == cudaSuccess ? "ready" : "not ready");
        int polls = 0;
        launch_fill(p.x, 6.0f, s);
        cudaEventRecord(e, s);
        while (cudaEventQuery(e) == cudaErrorNotReady && polls < 100) polls++;
        check(&c, polls == (lates ? 1 : 0), NAME("event query polled"), "ready after %d not-ready answers", polls);

        /* cudaFree synchronizes every stream */
        float *z;
        cudaMalloc((void **)&z, 64);
        launch_fill(p.x, 9.0f, s);
        cudaMemcpyAsync(h, p.x, N * sizeof(float), cudaMemcpyDeviceToHost, s);
        cudaFree(z);
        check(&c, h[0] == 9.0f && h[N - 1] == 9.0f, NAME("cudaFree synchronizes"), "host reads %g after cudaFree", h[0]);

        /* pageable D2H: complete on return */
        float g[N];
        launch_fill(p.y, 11.0f, s);
        cudaMemcpyAsync(g, p.y, sizeof g, cudaMemcpyDeviceToHost, s);
        check(&c, g[0] == 11.0f && g[N - 1] == 11.0f, NAME("pageable D2H"), "host reads %g at once", g[0]);

        /* cudaMemcpy2DAsync: 3 rows of 5 floats, source pitch 8, destination pitch 6 */
        for (int i = 0; i < 24; i++) g[i] = (float)i;
        cudaMemcpyAsync(p.x, g, 24 * sizeof(float), cudaMemcpyHostToDevice, s);
        launch_fill(p.y, 0.0f, s);
        cudaMemcpy2DAsync(p.y, 6 * sizeof(float), p.x, 8 * sizeof(float), 5 * sizeof(float), 3,
                          cudaMemcpyDeviceToDevice, s);
        float r[18];
        cudaMemcpyAsync(r, p.y, sizeof r, cudaMemcpyDeviceToHost, s);
        int bad = 0;
        for (int i = 0; i < 18; i++) bad += r[i] != (i % 6 == 5 ? 0.0f : (float)(i / 6 * 8 + i % 6));
        check(&c, bad == 0, NAME("cudaMemcpy2DAsync pitches"), "%d of 18 floats wrong", bad);

        /* an op that needs four steps */
        int steps = 0;
        CustomOp *op = new CustomOp;
        op->steps = &steps;
        op->name = "four-step op";
        emu_stream_enqueue(s, op);
        cudaStreamSynchronize(s);
        check(&c, steps == 4, NAME("multi-step op"), "stepped %d times", steps);
    }

    /* a pinned H2D source the host overwrote before the copy ran */
    if (lates) {
        out.clear();
        rc = run_child(argv[0], "pinned-h2d", nullptr, &out);
        check(&c, rc == 1 && out.find("the host wrote pinned buffer") != std::string::npos,
              NAME("pinned H2D source written early"), "exit %d, message: %s", rc, out.substr(0, out.find('\n')).c_str());
    }

    /* EMU_GPUS: the device count, selection and where memory lives */
    {
        int n = 0;
        cudaGetDeviceCount(&n);
        const int want = getenv("EMU_GPUS") ? atoi(getenv("EMU_GPUS")) : 1;
        const bool past = cudaSetDevice(n) == cudaErrorInvalidDevice;
        cudaSetDevice(n - 1);
        float *m;
        cudaMalloc((void **)&m, 16);
        const int owner = emu_dev_owner(m + 1, 4), cur = emu_current_device();
        cudaDeviceProp prop;
        cudaGetDeviceProperties(&prop, n - 1);
        cudaFree(m);
        cudaSetDevice(0);
        check(&c, n == want && past && owner == n - 1 && cur == n - 1 && strstr(prop.name, "device") != nullptr,
              NAME("devices"), "%d devices, memory on device %d, %s", n, owner, prop.name);
    }
    return check_done(&c);
}
