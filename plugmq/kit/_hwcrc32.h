/* CRC-32 for the compiled kernels: zlib's CRC (the one zlib.crc32 computes), computed by ISA-L
 * when its shared library is installed, by zlib otherwise.
 *
 * Why: checking a 1 KiB record costs zlib 1.2.13's table-driven crc32_z ~1.5 us (three calls:
 * tail, header, body), 15-19 % of a cold backlog pull. ISA-L's crc32_gzip_refl computes the same
 * CRC with PCLMULQDQ folding (its own CPU dispatch picks the code; plain C on a CPU without it),
 * ~5x cheaper per record here. It is loaded with dlopen at module init rather than linked, so a
 * kernel builds and runs without ISA-L's headers or library (Debian: libisal2), falling back to
 * zlib's crc32_z: same results either way. The choice is checked against zlib on a test vector
 * before it is used.
 *
 *   hwcrc32_select()     pick the implementation (call once, from the module's init)
 *   hwcrc32(crc, p, n)   the CRC of n bytes at p continuing `crc` (0 to start), as crc32_z
 *   hwcrc32_name()       "isa-l" or "zlib"
 */
#ifndef PLUGMQ_HWCRC32_H
#define PLUGMQ_HWCRC32_H

#include <dlfcn.h>
#include <stdint.h>
#include <zlib.h>

typedef uint32_t (*hwcrc32_fn)(uint32_t crc, const unsigned char *p, uint64_t n);

static uint32_t hwcrc32_zlib(uint32_t crc, const unsigned char *p, uint64_t n) {
    return (uint32_t)crc32_z(crc, p, (z_size_t)n);
}

static hwcrc32_fn hwcrc32_impl = hwcrc32_zlib;

static inline uint32_t hwcrc32(uint32_t crc, const unsigned char *p, size_t n) { return hwcrc32_impl(crc, p, n); }

static inline const char *hwcrc32_name(void) { return hwcrc32_impl == hwcrc32_zlib ? "zlib" : "isa-l"; }

/* Whether `fn` computes zlib's CRC-32 on a few lengths, from 0 and continuing a CRC. */
static int hwcrc32_agrees(hwcrc32_fn fn) {
    unsigned char data[1500];
    for (unsigned i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 131u + (i >> 3));
    static const unsigned lengths[] = {0, 1, 7, 16, 63, 88, 255, 1024, 1500};
    for (unsigned k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
        unsigned n = lengths[k];
        uint32_t seed = hwcrc32_zlib(0, data + 3, 24);
        if (fn(0, data, n) != hwcrc32_zlib(0, data, n) || fn(seed, data, n) != hwcrc32_zlib(seed, data, n)) return 0;
    }
    return 1;
}

static void hwcrc32_select(void) {
    static const char *const names[] = {"libisal.so.2", "libisal.so"};
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) continue;
        hwcrc32_fn fn = (hwcrc32_fn)dlsym(lib, "crc32_gzip_refl");
        if (fn != NULL && hwcrc32_agrees(fn)) {
            hwcrc32_impl = fn; /* the library stays loaded for the process's life */
            return;
        }
        dlclose(lib);
    }
    (void)dlerror(); /* nothing to report: zlib it is */
}

#endif
