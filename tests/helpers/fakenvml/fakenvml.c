/*
 * A fake libnvidia-ml.so.1 for pytest-cudastack's driver tests: it exports the NVML entry points that
 * nvidia-ml-py calls during probe_driver(), with behaviour chosen per process through environment variables,
 * so the real binding (pynvml) runs its whole path without a GPU or a driver.
 *
 * Build: cc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fakenvml.c
 *
 *   FAKENVML_DRIVER="550.54.15"        nvmlSystemGetDriverVersion (default 550.54.15; longer than the
 *                                      caller's buffer -> NVML_ERROR_INSUFFICIENT_SIZE, as the real one)
 *   FAKENVML_CUDA=12040                nvmlSystemGetCudaDriverVersion[_v2] (default 12040)
 *   FAKENVML_GPUS="NAME:CC:GIB[:MIG];..."   e.g. "NVIDIA H100 80GB HBM3:9.0:80:mig;NVIDIA A10:8.6:24"
 *                                      MIG field "mig" (enabled) / "nomig" (disabled) / absent (not supported)
 *   FAKENVML_FAIL_<CALL>=<code>        make a call return an NVML error code; CALL is one of
 *                                      INIT, SHUTDOWN, DRIVER, CUDA_V2, CUDA_V1, COUNT, HANDLE, NAME, UUID,
 *                                      CC, MEMORY, MIG
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define MAX_GPUS 16

struct gpu {
    char name[96];
    int cc_major, cc_minor;
    unsigned long long memory;
    int mig; /* -1 not supported, 0 disabled, 1 enabled */
};

static struct gpu gpus[MAX_GPUS];
static int gpu_count = 0;
static int initialised = 0;

static int fail(const char *call) {
    char key[64];
    snprintf(key, sizeof key, "FAKENVML_FAIL_%s", call);
    const char *v = getenv(key);
    return (v && *v) ? atoi(v) : 0;
}

static void parse_gpus(void) {
    const char *spec = getenv("FAKENVML_GPUS");
    gpu_count = 0;
    if (!spec || !*spec) return;
    char buf[2048];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *item = strtok_r(buf, ";", &save); item && gpu_count < MAX_GPUS; item = strtok_r(NULL, ";", &save)) {
        struct gpu *g = &gpus[gpu_count];
        memset(g, 0, sizeof *g);
        g->mig = -1;
        char *f2 = NULL, *fields[4] = {0};
        int n = 0;
        for (char *f = strtok_r(item, ":", &f2); f && n < 4; f = strtok_r(NULL, ":", &f2)) fields[n++] = f;
        if (n < 3) continue;
        snprintf(g->name, sizeof g->name, "%s", fields[0]);
        sscanf(fields[1], "%d.%d", &g->cc_major, &g->cc_minor);
        g->memory = strtoull(fields[2], NULL, 10) << 30;
        if (n == 4) g->mig = strcmp(fields[3], "mig") == 0 ? 1 : 0;
        gpu_count++;
    }
}

static int index_of(nvmlDevice_t device) {
    intptr_t i = (intptr_t)device - 1;
    return (i >= 0 && i < gpu_count) ? (int)i : -1;
}

static nvmlReturn_t copy_string(const char *value, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    int rc = fail("INIT");
    if (rc) return rc;
    parse_gpus();
    initialised = 1;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    int rc = fail("SHUTDOWN");
    initialised = 0;
    return rc;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    static char text[64];
    snprintf(text, sizeof text, "fake NVML error %d", result);
    return text;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    int rc = fail("DRIVER");
    if (rc) return rc;
    const char *v = getenv("FAKENVML_DRIVER");
    return copy_string(v ? v : "550.54.15", version, length);
}

static nvmlReturn_t cuda_version(const char *call, int *out) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    int rc = fail(call);
    if (rc) return rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    const char *v = getenv("FAKENVML_CUDA");
    *out = v ? atoi(v) : 12040;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return cuda_version("CUDA_V2", v); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return cuda_version("CUDA_V1", v); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    int rc = fail("COUNT");
    if (rc) return rc;
    *count = (unsigned int)gpu_count;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    int rc = fail("HANDLE");
    if (rc) return rc;
    if ((int)index >= gpu_count || !device) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)(intptr_t)(index + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    int i = index_of(device), rc = fail("NAME");
    if (rc) return rc;
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    return copy_string(gpus[i].name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    int i = index_of(device), rc = fail("UUID");
    if (rc) return rc;
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    char text[96];
    snprintf(text, sizeof text, "GPU-00000000-0000-0000-0000-%012d", i);
    return copy_string(text, uuid, length);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    int i = index_of(device), rc = fail("CC");
    if (rc) return rc;
    if (i < 0 || !major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = gpus[i].cc_major;
    *minor = gpus[i].cc_minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    int i = index_of(device), rc = fail("MEMORY");
    if (rc) return rc;
    if (i < 0 || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = gpus[i].memory;
    memory->used = 0;
    memory->free = gpus[i].memory;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    int i = index_of(device), rc = fail("MIG");
    if (rc) return rc;
    if (i < 0 || !current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpus[i].mig < 0) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned int)gpus[i].mig;
    return NVML_SUCCESS;
}
