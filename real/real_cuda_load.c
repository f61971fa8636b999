/* real_cuda_load: zreal's CUDA parts as a library it opens on demand (real_cuda_load.h): linked
 * in, CUDA's libraries (cuBLASLt's constructors above all) cost every CPU rank 77 ms at start. */
#include "real_cuda_load.h"
#include "zp_util.h"

#include <dlfcn.h>

#define REAL_CUDA_LIBRARY "libzcuda.so"

#ifdef ZP_HAVE_CUDA
/* The library beside the running program: the build folder's, wherever that is. */
static char *library_path(GError **error)
{
    GError *local = NULL;
    char *self = g_file_read_link("/proc/self/exe", &local);
    if (!self) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "cannot find " REAL_CUDA_LIBRARY
                    " beside this program: /proc/self/exe: %s", local->message);
        g_error_free(local);
        return NULL;
    }
    char *dir = g_path_get_dirname(self);
    char *path = g_build_filename(dir, REAL_CUDA_LIBRARY, NULL);
    g_free(dir);
    g_free(self);
    return path;
}

gboolean real_cuda_load(RealCudaEntries *entries, GError **error)
{
    char *path = library_path(error);
    if (!path)
        return FALSE;
    /* RTLD_NOW: a symbol it needs from zreal and does not find fails here, in one line, not
     * mid-run; RTLD_GLOBAL is not needed, nothing else resolves against it. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "cannot load " REAL_CUDA_LIBRARY ": %s",
                    dlerror());
        g_free(path);
        return FALSE;
    }
    static const char *const names[] = {"real_cuda_gemm_mode_from_env", "real_cuda_backend_new",
                                        "real_comm_nccl_new"};
    void *found[G_N_ELEMENTS(names)];
    for (size_t i = 0; i < G_N_ELEMENTS(names); i++) {
        found[i] = dlsym(lib, names[i]);
        if (!found[i]) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s has no %s", path, names[i]);
            g_free(path);
            return FALSE;
        }
    }
    g_free(path);
    /* POSIX: a dlsym result converts to a function pointer (dlsym's rationale). */
    *(void **)&entries->gemm_mode_from_env = found[0];
    *(void **)&entries->backend_new = found[1];
    *(void **)&entries->comm_nccl_new = found[2];
    return TRUE;
}
#else
gboolean real_cuda_load(RealCudaEntries *entries, GError **error)
{
    (void)entries;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "this zreal was built without CUDA (no nvcc "
                "under CUDA_HOME when it was built)");
    return FALSE;
}
#endif
