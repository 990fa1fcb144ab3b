/* test/emu/emu_transform.cpp: rewrites a .cu file of this repository into
 * C++ that the host compiler builds against test/emu/emu.h, so that the real
 * kernel source runs under the CPU emulation (never a hand copy of it).
 *
 *   emu_transform IN.cu NAME OUT.cpp
 *
 * Four rewrites, all lexical, outside comments and string literals (macro
 * bodies included), each
 * keeping the line count so that the `#line 1 "NAME"` put on top makes
 * diagnostics, __FILE__ and __LINE__ name the original file and line:
 *   1. A __device__ function (top-level declaration, with its `template`
 *      line) whose body contains `asm` is put inside `#if 0 ... #endif`:
 *      these are the inline-PTX wrappers (cp.async, ldmatrix, mma.sync), and
 *      emu.h defines functions of the same names and signatures. One that
 *      emu.h does not define is a compile error ("not declared"), never a
 *      silent gap. __global__ kernels are kept whole: their PTX sits inside
 *      `#if defined(__CUDA_ARCH__) ...`, which the host compiler drops.
 *   2. `extern __shared__ ... T NAME[];` becomes
 *      `T *const NAME = (T *)emu_dynamic_smem();` (the block's emulated
 *      dynamic shared memory).
 *   3. Any other `__shared__` becomes `static thread_local`: one object
 *      shared by every fiber of the block that runs on this OS thread.
 *   4. `K<<<cfg>>>(args)` becomes `K % emu_config("K", cfg)(args)`:
 *      emu_config packs the configuration and the arguments, and `%` with
 *      the kernel (emu.h) queues the grid on the launch's stream. K may be a
 *      template-id; its text, as far as launched_kernel finds it, only
 *      names the kernel in the runtime's messages.
 * Exit status 1, with a message, on an unreadable file or unbalanced braces.
 */
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Range { size_t begin, end; };  /* [begin, end) byte offsets of whole lines */

bool ident_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

/* A mask of the same length as s: 1 where s holds code, 2 where it holds
 * code of a preprocessor line (a #define's body is rewritten too, but its
 * braces do not count), 0 in comments and string and character literals. */
std::vector<char> code_mask(const std::string &s) {
    std::vector<char> m(s.size(), 1);
    size_t i = 0, n = s.size();
    bool line_start = true, pp = false;
    while (i < n) {
        char c = s[i];
        if (c == '\\' && i + 1 < n && s[i + 1] == '\n') { m[i] = pp ? 2 : 1; i += 2; continue; }
        if (c == '\n') { line_start = true; pp = false; i++; continue; }
        if (line_start && c == '#') pp = true;
        if (c != ' ' && c != '\t') line_start = false;
        if (c == '/' && i + 1 < n && s[i + 1] == '/') {
            while (i < n && s[i] != '\n') m[i++] = 0;
            continue;
        }
        if (c == '/' && i + 1 < n && s[i + 1] == '*') {
            size_t e = s.find("*/", i + 2);
            e = e == std::string::npos ? n : e + 2;
            for (; i < e; i++) if (s[i] != '\n') m[i] = 0;
            continue;
        }
        if (c == '"' || c == '\'') {
            m[i++] = 0;
            while (i < n && s[i] != c) {
                if (s[i] == '\\') m[i++] = 0;
                if (i < n) m[i++] = 0;
            }
            if (i < n) m[i++] = 0;
            continue;
        }
        m[i++] = pp ? 2 : 1;
    }
    return m;
}

/* Whether the code token `w` starts at i (whole identifier). */
bool word_at(const std::string &s, const std::vector<char> &m, size_t i, const char *w) {
    size_t k = 0;
    for (; w[k]; k++)
        if (i + k >= s.size() || s[i + k] != w[k] || !m[i + k]) return false;
    if (i > 0 && ident_char(s[i - 1])) return false;
    if (i + k < s.size() && ident_char(s[i + k])) return false;
    return true;
}

size_t line_begin(const std::string &s, size_t i) {
    while (i > 0 && s[i - 1] != '\n') i--;
    return i;
}
size_t line_end(const std::string &s, size_t i) {  /* just past the '\n' */
    size_t e = s.find('\n', i);
    return e == std::string::npos ? s.size() : e + 1;
}
int line_of(const std::string &s, size_t i) {
    int l = 1;
    for (size_t k = 0; k < i; k++) l += s[k] == '\n';
    return l;
}

[[noreturn]] void die(const std::string &msg) {
    fprintf(stderr, "emu_transform: %s\n", msg.c_str());
    exit(1);
}

/* Rewrite 1: the line ranges of top-level __device__ functions containing asm. */
std::vector<Range> asm_functions(const std::string &s, const std::vector<char> &m, const std::string &name) {
    std::vector<Range> out;
    int depth = 0;
    size_t decl = std::string::npos;  /* first code byte of the current top-level declaration */
    bool has_asm = false;
    for (size_t i = 0; i < s.size(); i++) {
        if (m[i] != 1) continue;
        char c = s[i];
        if (depth == 0 && decl == std::string::npos && c != ' ' && c != '\t' && c != '\n') {
            decl = i;
            has_asm = false;
        }
        if (c == '{') depth++;
        else if (c == '}') {
            if (--depth < 0) die(name + ": unbalanced '}' at line " + std::to_string(line_of(s, i)));
            if (depth == 0) {
                if (has_asm) {
                    std::string head = s.substr(decl, s.find('{', decl) - decl);
                    if (head.find("__device__") != std::string::npos && head.find("__global__") == std::string::npos)
                        out.push_back({line_begin(s, decl), line_end(s, i)});
                }
                decl = std::string::npos;
            }
        } else if (c == ';' && depth == 0) {
            decl = std::string::npos;
        } else if (depth > 0 && c == 'a' && word_at(s, m, i, "asm")) {
            has_asm = true;
        }
    }
    if (depth != 0) die(name + ": unbalanced braces");
    return out;
}

/* Rewrites 2-4 on one range of code. */
/* The kernel a launch names, as written before its `<<<` (an identifier,
 * perhaps qualified, perhaps with template arguments), for the runtime's
 * messages: the text at the end of `out`, quotes and newlines left out. */
std::string launched_kernel(const std::string &out) {
    size_t e = out.size();
    while (e > 0 && out[e - 1] == ' ') e--;
    size_t b = e;
    for (;;) {
        if (b > 0 && out[b - 1] == '>') {
            int depth = 0;
            while (b > 0) {
                const char c = out[--b];
                if (c == '>') depth++;
                else if (c == '<' && --depth == 0) break;
            }
        }
        while (b > 0 && (ident_char(out[b - 1]) || out[b - 1] == ':')) b--;
        if (b == 0 || out[b - 1] != '>') break;
    }
    std::string k;
    for (size_t j = b; j < e; j++)
        if (out[j] != '"' && out[j] != '\\' && out[j] != '\n') k += out[j];
    return k;
}

std::string rewrite_code(const std::string &s, const std::vector<char> &m, size_t b, size_t e) {
    std::string out;
    for (size_t i = b; i < e;) {
        if (!m[i]) { out += s[i++]; continue; }
        if (word_at(s, m, i, "extern")) {
            size_t j = i + 6;
            while (j < e && (s[j] == ' ' || s[j] == '\t')) j++;
            if (word_at(s, m, j, "__shared__")) {
                size_t semi = s.find(';', j);
                std::string decl = s.substr(j + 10, semi - (j + 10));  /* "__align__(16) unsigned char x[]" */
                size_t al = decl.find("__align__");
                if (al != std::string::npos) decl.erase(al, decl.find(')', al) + 1 - al);
                size_t br = decl.find("[]");
                if (br == std::string::npos || decl.find('\n') != std::string::npos)
                    die("extern __shared__ declaration not of the form `T name[];` at line " + std::to_string(line_of(s, i)));
                size_t ne = br;
                while (ne > 0 && decl[ne - 1] == ' ') ne--;
                size_t nb = ne;
                while (nb > 0 && ident_char(decl[nb - 1])) nb--;
                std::string type = decl.substr(0, nb), var = decl.substr(nb, ne - nb);
                while (!type.empty() && type[0] == ' ') type.erase(0, 1);
                while (!type.empty() && type.back() == ' ') type.pop_back();
                out += type + " *const " + var + " = (" + type + " *)emu_dynamic_smem();";
                i = semi + 1;
                continue;
            }
        }
        if (word_at(s, m, i, "__shared__")) { out += "static thread_local"; i += 10; continue; }
        if (s.compare(i, 3, "<<<") == 0) {
            out += " % emu_config(\"" + launched_kernel(out) + "\", ";
            i += 3;
            continue;
        }
        if (s.compare(i, 3, ">>>") == 0) { out += ")"; i += 3; continue; }
        out += s[i++];
    }
    return out;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 4) die("usage: emu_transform IN.cu NAME OUT.cpp");
    std::ifstream in(argv[1], std::ios::binary);
    if (!in) die(std::string("cannot read ") + argv[1]);
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string s = buf.str(), name = argv[2];
    const std::vector<char> m = code_mask(s);
    const std::vector<Range> drop = asm_functions(s, m, name);

    std::string out = "#include \"emu.h\"\n#line 1 \"" + name + "\"\n";
    size_t pos = 0;
    for (const Range &r : drop) {
        out += rewrite_code(s, m, pos, r.begin);
        out += "#if 0 /* emu: inline PTX, emulated in test/emu/emu.h */\n";
        out += s.substr(r.begin, r.end - r.begin);
        out += "#endif\n#line " + std::to_string(line_of(s, r.end)) + " \"" + name + "\"\n";
        pos = r.end;
    }
    out += rewrite_code(s, m, pos, s.size());

    std::ofstream o(argv[3], std::ios::binary);
    if (!o || !(o << out)) die(std::string("cannot write ") + argv[3]);
    fprintf(stderr, "emu_transform: %s: %zu inline-PTX functions left to emu.h\n", name.c_str(), drop.size());
    return 0;
}
