// Shim for ROCm's librocm_sysdeps_z.so.1 / librocm_sysdeps_zstd.so.1, which the libLLVM.so of
// the PyPI wheel rocm-bindings-compiler links against (symbols versioned AMDROCM_SYSDEPS_1.0).
// Each function forwards to the system libz.so.1 / libzstd.so.1, opened with dlopen so this
// file needs no zlib or zstd headers. Built by scripts/llvm23-setup.sh with
//   cc -shared -fPIC -DSHIM_ZSTD=0|1 -Wl,--version-script=sysdeps.map -Wl,-soname,<name> ...
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

static void* forward(const char* lib, const char* sym) {
  static void* handle;
  if (!handle && !(handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL))) {
    fprintf(stderr, "rocm sysdeps shim: %s\n", dlerror());
    abort();
  }
  void* f = dlsym(handle, sym);
  if (!f) {
    fprintf(stderr, "rocm sysdeps shim: %s has no %s\n", lib, sym);
    abort();
  }
  return f;
}
#define FWD(lib, ret, name, params, args)                                              \
  ret name params {                                                                    \
    static ret(*f) params;                                                             \
    if (!f) f = (ret(*) params)forward(lib, #name);                                    \
    return f args;                                                                     \
  }

#if SHIM_ZSTD
#define Z "libzstd.so.1"
FWD(Z, size_t, ZSTD_CCtx_setParameter, (void* c, int p, int v), (c, p, v))
FWD(Z, size_t, ZSTD_compress2, (void* c, void* d, size_t dc, const void* s, size_t sn), (c, d, dc, s, sn))
FWD(Z, size_t, ZSTD_compressBound, (size_t n), (n))
FWD(Z, void*, ZSTD_createCCtx, (void), ())
FWD(Z, size_t, ZSTD_decompress, (void* d, size_t dc, const void* s, size_t sn), (d, dc, s, sn))
FWD(Z, size_t, ZSTD_freeCCtx, (void* c), (c))
FWD(Z, const char*, ZSTD_getErrorName, (size_t code), (code))
FWD(Z, unsigned, ZSTD_isError, (size_t code), (code))
#else
#define Z "libz.so.1"
FWD(Z, int, compress2, (unsigned char* d, unsigned long* dn, const unsigned char* s, unsigned long sn, int level), (d, dn, s, sn, level))
FWD(Z, unsigned long, compressBound, (unsigned long n), (n))
FWD(Z, unsigned long, crc32, (unsigned long crc, const unsigned char* buf, unsigned len), (crc, buf, len))
FWD(Z, int, uncompress, (unsigned char* d, unsigned long* dn, const unsigned char* s, unsigned long sn), (d, dn, s, sn))
#endif
