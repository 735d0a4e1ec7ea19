/*
 * mock_nvml.c - a stand-in for NVIDIA's libnvidia-ml.so.1 for tests without a GPU.
 *
 * The project's code, the real nvidia-ml-py (pynvml) and our nvidia-smi script all
 * talk to "NVML" through this library exactly as they would to the real one: same
 * symbol names, same struct layouts, same return codes.  We simulate the GPU *below*
 * the API so that nothing above it needs a test-only code path.
 *
 *   hardware  = a read-only profile file (MOCK_NVML_PROFILE, else
 *               /etc/mock-nvml/gpu.profile); no file means "no driver loaded".
 *   volatile  = a state directory (MOCK_NVML_STATE_DIR, else /run/mock-nvml), a tmpfs
 *               in test containers, so a container restart is a simulated reboot that
 *               forgets persistence mode, locked clocks, power limits and app clocks,
 *               just like a real card.
 *   kernel    = <state dir>/loaded_kernel_module_version: written on first init after
 *               "boot"; a library of another version then fails with
 *               NVML_ERROR_LIB_RM_VERSION_MISMATCH until the next reboot, which is what
 *               an unattended driver upgrade does to a real host.
 *
 * State is re-read from disk on every query (never cached) because several processes
 * share one simulated card: nvidia-smi sets a clock, pynvml in another process must see it.
 *
 * Only libc is used, and only C99 + GNU extensions that gcc 9 (Ubuntu 20.04) accepts.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef MOCK_DRIVER_VERSION
#define MOCK_DRIVER_VERSION "525.147.05"
#endif
#ifndef MOCK_CUDA_DRIVER_VERSION
#define MOCK_CUDA_DRIVER_VERSION 12000
#endif

/* Everything not marked EXPORT stays private (built with -fvisibility=hidden), so the
 * library exposes only NVML names, as the real one does. */
#define EXPORT __attribute__((visibility("default")))

#define DEFAULT_PROFILE "/etc/mock-nvml/gpu.profile"
#define DEFAULT_STATE_DIR "/run/mock-nvml"
#define STATE_FILE "state"
#define KMOD_FILE "loaded_kernel_module_version"

/* ---- NVML ABI: values and layouts as in nvml.h / pynvml 13.615.71 ---------------- */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2 };
enum {
    NVML_CLOCK_ID_CURRENT = 0,
    NVML_CLOCK_ID_APP_CLOCK_TARGET = 1,
    NVML_CLOCK_ID_APP_CLOCK_DEFAULT = 2,
    NVML_CLOCK_ID_CUSTOMER_BOOST_MAX = 3,
};
enum { NVML_TEMPERATURE_GPU = 0 };
enum { NVML_BRAND_TESLA = 2 };
enum { NVML_DEVICE_ARCH_AMPERE = 7, NVML_DEVICE_ARCH_VOLTA = 5 };

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

/* Layout used by the _v1/_v2 PCI calls of old drivers. */
typedef struct {
    char busId[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    unsigned int reserved0, reserved1, reserved2, reserved3;
} nvmlPciInfo_v2_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define NVML_STRUCT_VERSION(type, ver) ((unsigned int)(sizeof(type) | ((ver) << 24U)))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(nvmlMemory_v2_t, 2)

typedef struct {
    unsigned long long bar1Total, bar1Free, bar1Used;
} nvmlBAR1Memory_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_v2_t layout");

/* ---- the simulated hardware ----------------------------------------------------- */

#define MAX_GPUS 16 /* a DGX-2 has 16 V100s */
#define MAX_CLOCKS 512
#define MAX_CPUS 1024
#define CPU_WORDS (MAX_CPUS / 64)

struct pci_addr {
    unsigned int domain, bus, device;
};

struct nvmlDevice_st {
    unsigned int index;
    char name[96], uuid[96], serial[32];
    struct pci_addr pci;
    unsigned int pci_device_id, pci_subsystem_id;
    unsigned long long mem_total, mem_reserved, bar1_total;
    int cc_major, cc_minor;
    unsigned int arch, brand, bus_width, minor_number;
    unsigned int max_mem_clock, max_gfx_clock, max_sm_clock;
    unsigned int default_app_gfx, default_app_mem, idle_gfx_clock;
    unsigned int mem_clocks[MAX_CLOCKS], n_mem_clocks;
    unsigned int gfx_clocks[MAX_CLOCKS], n_gfx_clocks;
    unsigned int power_min, power_max, power_default, idle_power, idle_temp;
    int numa_node; /* -1: not reported (as on many VMs) */
    unsigned long long cpu_affinity[CPU_WORDS];
    unsigned int nvlink_link_count, nvlink_version;
    struct pci_addr nvlink_peers[MAX_GPUS];
    unsigned int n_nvlink_peers;
    /* InfoROM: what a used card carries from its past, across reboots. */
    unsigned int ecc_enabled;
    unsigned long long ecc_corrected_aggregate, ecc_uncorrected_aggregate;
    unsigned int retired_pages_sbe, retired_pages_dbe, retired_pages_pending;
    unsigned int remapped_rows_correctable, remapped_rows_uncorrectable;
    unsigned int remapped_rows_pending, remapped_rows_failure;
};
typedef struct nvmlDevice_st *nvmlDevice_t;

static struct nvmlDevice_st g_gpus[MAX_GPUS];
static unsigned int g_gpu_count;
static int g_refcount; /* nvmlInit/nvmlShutdown nest, as in the real library */
static int g_lock;     /* guards init/shutdown; ctypes drops the GIL around calls */

static void big_lock(void)
{
    while (__atomic_exchange_n(&g_lock, 1, __ATOMIC_ACQUIRE))
        usleep(100);
}

static void big_unlock(void)
{
    __atomic_store_n(&g_lock, 0, __ATOMIC_RELEASE);
}

/* ---- key=value files (used for both the profile and the state file) ------------- */

struct kv {
    char *key, *val;
};
struct kvlist {
    struct kv *items;
    size_t n, cap;
};

static char *trim(char *s)
{
    char *end;
    while (isspace((unsigned char)*s))
        s++;
    end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

static void kv_free(struct kvlist *l)
{
    size_t i;
    for (i = 0; i < l->n; i++) {
        free(l->items[i].key);
        free(l->items[i].val);
    }
    free(l->items);
    l->items = NULL;
    l->n = l->cap = 0;
}

static const char *kv_get(const struct kvlist *l, const char *key)
{
    size_t i;
    for (i = 0; i < l->n; i++)
        if (strcmp(l->items[i].key, key) == 0)
            return l->items[i].val;
    return NULL;
}

/* Set (val != NULL) or remove (val == NULL) a key; a later duplicate replaces the earlier. */
static int kv_set(struct kvlist *l, const char *key, const char *val)
{
    size_t i;
    for (i = 0; i < l->n; i++) {
        if (strcmp(l->items[i].key, key) != 0)
            continue;
        free(l->items[i].val);
        if (val) {
            l->items[i].val = strdup(val);
            return l->items[i].val ? 0 : -1;
        }
        free(l->items[i].key);
        l->items[i] = l->items[--l->n];
        return 0;
    }
    if (!val)
        return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        struct kv *items = realloc(l->items, cap * sizeof(*items));
        if (!items)
            return -1;
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n].key = strdup(key);
    l->items[l->n].val = strdup(val);
    if (!l->items[l->n].key || !l->items[l->n].val)
        return -1;
    l->n++;
    return 0;
}

/* Returns 0, or -1 with errno set when the file cannot be opened.  Malformed lines
 * (no '=') are reported and skipped rather than failing: a comment typo should not
 * make the "GPU" vanish. */
static int kv_read_file(const char *path, struct kvlist *out)
{
    char line[16384];
    FILE *f = fopen(path, "re");
    unsigned int lineno = 0;
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        char *s = trim(line), *eq;
        lineno++;
        if (*s == '\0' || *s == '#')
            continue;
        eq = strchr(s, '=');
        if (!eq) {
            fprintf(stderr, "mock-nvml: %s:%u: ignoring line without '='\n", path, lineno);
            continue;
        }
        *eq = '\0';
        if (kv_set(out, trim(s), trim(eq + 1)) != 0) {
            fclose(f);
            errno = ENOMEM;
            return -1;
        }
    }
    fclose(f);
    return 0;
}

/* ---- parsing helpers ------------------------------------------------------------ */

static int parse_u64(const char *s, unsigned long long *out)
{
    char *end;
    if (!s || !*s || *s == '-')
        return -1;
    errno = 0;
    *out = strtoull(s, &end, 0);
    return (errno || *trim(end) != '\0') ? -1 : 0;
}

static int parse_int(const char *s, long long *out)
{
    char *end;
    if (!s || !*s)
        return -1;
    errno = 0;
    *out = strtoll(s, &end, 0);
    return (errno || *trim(end) != '\0') ? -1 : 0;
}

/* Accepts "00000000:18:00.0", "0000:18:00.0" and "18:00.0", like nvmlDeviceGetHandleByPciBusId. */
static int parse_pci(const char *s, struct pci_addr *out)
{
    unsigned int a, b, c, fn;
    char tail;
    if (sscanf(s, "%x:%x:%x.%x%c", &a, &b, &c, &fn, &tail) == 4) {
        out->domain = a;
        out->bus = b;
        out->device = c;
        return 0;
    }
    if (sscanf(s, "%x:%x.%x%c", &b, &c, &fn, &tail) == 3) {
        out->domain = 0;
        out->bus = b;
        out->device = c;
        return 0;
    }
    return -1;
}

static int parse_uint_list(const char *s, unsigned int *out, unsigned int max, unsigned int *n)
{
    char buf[16384], *tok, *save = NULL;
    *n = 0;
    if (strlen(s) >= sizeof(buf))
        return -1;
    strcpy(buf, s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        unsigned long long v;
        if (*n >= max || parse_u64(trim(tok), &v) != 0 || v > 0xffffffffULL)
            return -1;
        out[(*n)++] = (unsigned int)v;
    }
    return 0;
}

/* "0-19,40-59" -> bit mask, the format of /sys/devices/system/node/node0/cpulist. */
static int parse_cpu_list(const char *s, unsigned long long *mask)
{
    char buf[4096], *tok, *save = NULL;
    memset(mask, 0, CPU_WORDS * sizeof(*mask));
    if (strlen(s) >= sizeof(buf))
        return -1;
    strcpy(buf, s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        unsigned int lo, hi, cpu;
        char tail;
        tok = trim(tok);
        if (sscanf(tok, "%u-%u%c", &lo, &hi, &tail) != 2) {
            if (sscanf(tok, "%u%c", &lo, &tail) != 1)
                return -1;
            hi = lo;
        }
        if (lo > hi || hi >= MAX_CPUS)
            return -1;
        for (cpu = lo; cpu <= hi; cpu++)
            mask[cpu / 64] |= 1ULL << (cpu % 64);
    }
    return 0;
}

static void format_bus_id(const struct pci_addr *p, char *out, size_t len)
{
    snprintf(out, len, "%08X:%02X:%02X.0", p->domain, p->bus, p->device);
}

/* ---- profile loading ------------------------------------------------------------ */

struct profile_ctx {
    const struct kvlist *kv;
    const char *path;
    unsigned int gpu;
    int ok;
};

/* gpu<i>.<key> overrides gpu.<key>. */
static const char *prof_raw(struct profile_ctx *c, const char *key)
{
    char k[160];
    const char *v;
    snprintf(k, sizeof(k), "gpu%u.%s", c->gpu, key);
    v = kv_get(c->kv, k);
    if (v)
        return v;
    snprintf(k, sizeof(k), "gpu.%s", key);
    return kv_get(c->kv, k);
}

static void prof_error(struct profile_ctx *c, const char *key, const char *what)
{
    fprintf(stderr, "mock-nvml: %s: gpu%u: %s '%s'\n", c->path, c->gpu, what, key);
    c->ok = 0;
}

static const char *prof_str(struct profile_ctx *c, const char *key, const char *def)
{
    const char *v = prof_raw(c, key);
    if (v)
        return v;
    if (!def)
        prof_error(c, key, "missing key");
    return def ? def : "";
}

static void prof_strcpy(struct profile_ctx *c, const char *key, char *dst, size_t len)
{
    const char *v = prof_str(c, key, NULL);
    if (strlen(v) >= len)
        prof_error(c, key, "value too long for");
    snprintf(dst, len, "%s", v);
}

/* required when def_present is 0 */
static unsigned long long prof_u64(struct profile_ctx *c, const char *key, int def_present,
                                   unsigned long long def)
{
    unsigned long long v;
    const char *s = prof_raw(c, key);
    if (!s) {
        if (!def_present)
            prof_error(c, key, "missing key");
        return def;
    }
    if (parse_u64(s, &v) != 0) {
        prof_error(c, key, "not a non-negative number:");
        return def;
    }
    return v;
}

static unsigned int prof_u32(struct profile_ctx *c, const char *key, int def_present, unsigned int def)
{
    unsigned long long v = prof_u64(c, key, def_present, def);
    if (v > 0xffffffffULL) {
        prof_error(c, key, "out of range:");
        return def;
    }
    return (unsigned int)v;
}

static void load_gpu(struct profile_ctx *c, struct nvmlDevice_st *g)
{
    const char *s;
    unsigned int i, lowest;
    long long numa = -1;

    memset(g, 0, sizeof(*g));
    g->index = c->gpu;
    prof_strcpy(c, "name", g->name, sizeof(g->name));
    prof_strcpy(c, "uuid", g->uuid, sizeof(g->uuid));
    prof_strcpy(c, "serial", g->serial, sizeof(g->serial));
    if (parse_pci(prof_str(c, "pci_bus_id", NULL), &g->pci) != 0)
        prof_error(c, "pci_bus_id", "bad PCI address in");
    g->pci_device_id = prof_u32(c, "pci_device_id", 0, 0);
    g->pci_subsystem_id = prof_u32(c, "pci_subsystem_id", 1, 0);
    g->mem_total = prof_u64(c, "memory_total_bytes", 0, 0);
    g->mem_reserved = prof_u64(c, "memory_reserved_bytes", 1, 0);
    g->bar1_total = prof_u64(c, "bar1_total_bytes", 1, 256ULL << 20);
    g->cc_major = (int)prof_u32(c, "cuda_cc_major", 0, 0);
    g->cc_minor = (int)prof_u32(c, "cuda_cc_minor", 0, 0);
    g->arch = prof_u32(c, "architecture", 0, 0);
    g->brand = prof_u32(c, "brand", 1, NVML_BRAND_TESLA);
    g->bus_width = prof_u32(c, "memory_bus_width_bits", 0, 0);
    g->minor_number = prof_u32(c, "minor_number", 0, 0);
    g->max_mem_clock = prof_u32(c, "max_mem_clock_mhz", 0, 0);
    g->max_gfx_clock = prof_u32(c, "max_gfx_clock_mhz", 0, 0);
    g->max_sm_clock = prof_u32(c, "max_sm_clock_mhz", 0, 0);
    g->default_app_gfx = prof_u32(c, "default_app_gfx_clock_mhz", 0, 0);
    g->default_app_mem = prof_u32(c, "default_app_mem_clock_mhz", 0, 0);
    g->idle_gfx_clock = prof_u32(c, "idle_gfx_clock_mhz", 0, 0);
    if (parse_uint_list(prof_str(c, "supported_mem_clocks_mhz", NULL), g->mem_clocks, MAX_CLOCKS,
                        &g->n_mem_clocks) != 0 || g->n_mem_clocks == 0)
        prof_error(c, "supported_mem_clocks_mhz", "bad clock list in");
    if (parse_uint_list(prof_str(c, "supported_gfx_clocks_mhz", NULL), g->gfx_clocks, MAX_CLOCKS,
                        &g->n_gfx_clocks) != 0 || g->n_gfx_clocks == 0)
        prof_error(c, "supported_gfx_clocks_mhz", "bad clock list in");
    g->power_min = prof_u32(c, "power_min_mw", 0, 0);
    g->power_max = prof_u32(c, "power_max_mw", 0, 0);
    g->power_default = prof_u32(c, "power_default_mw", 0, 0);
    if (g->power_min > g->power_default || g->power_default > g->power_max)
        prof_error(c, "power_default_mw", "need power_min_mw <= power_default_mw <= power_max_mw for");
    g->idle_power = prof_u32(c, "idle_power_mw", 1, g->power_min / 4);
    g->idle_temp = prof_u32(c, "idle_temp_c", 1, 35);

    s = prof_str(c, "numa_node", NULL);
    if (parse_int(s, &numa) != 0 || numa < -1 || numa > 4096)
        prof_error(c, "numa_node", "bad number in");
    g->numa_node = (int)numa;
    if (parse_cpu_list(prof_str(c, "cpu_affinity", NULL), g->cpu_affinity) != 0)
        prof_error(c, "cpu_affinity", "bad cpu list in");

    g->nvlink_link_count = prof_u32(c, "nvlink_link_count", 1, 0);
    g->nvlink_version = prof_u32(c, "nvlink_version", 1, 2); /* Volta = NVLink 2.0 */
    s = prof_str(c, "nvlink_peers", "");
    if (*s) {
        char buf[2048], *tok, *save = NULL;
        snprintf(buf, sizeof(buf), "%s", s);
        for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (g->n_nvlink_peers >= MAX_GPUS || parse_pci(trim(tok), &g->nvlink_peers[g->n_nvlink_peers]) != 0) {
                prof_error(c, "nvlink_peers", "bad PCI address list in");
                break;
            }
            g->n_nvlink_peers++;
        }
    }
    if (g->n_nvlink_peers > g->nvlink_link_count)
        prof_error(c, "nvlink_link_count", "fewer links than nvlink_peers in");

    g->ecc_enabled = prof_u32(c, "ecc_enabled", 1, 1);
    g->ecc_corrected_aggregate = prof_u64(c, "ecc_corrected_aggregate", 1, 0);
    g->ecc_uncorrected_aggregate = prof_u64(c, "ecc_uncorrected_aggregate", 1, 0);
    g->retired_pages_sbe = prof_u32(c, "retired_pages_sbe", 1, 0);
    g->retired_pages_dbe = prof_u32(c, "retired_pages_dbe", 1, 0);
    g->retired_pages_pending = prof_u32(c, "retired_pages_pending", 1, 0);
    g->remapped_rows_correctable = prof_u32(c, "remapped_rows_correctable", 1, 0);
    g->remapped_rows_uncorrectable = prof_u32(c, "remapped_rows_uncorrectable", 1, 0);
    g->remapped_rows_pending = prof_u32(c, "remapped_rows_pending", 1, 0);
    g->remapped_rows_failure = prof_u32(c, "remapped_rows_failure", 1, 0);

    /* The idle clock must be one the card can run at, or ClockInfo would lie. */
    lowest = g->gfx_clocks[0];
    for (i = 0; i < g->n_gfx_clocks; i++)
        if (g->gfx_clocks[i] < lowest)
            lowest = g->gfx_clocks[i];
    if (c->ok && g->idle_gfx_clock < lowest)
        prof_error(c, "idle_gfx_clock_mhz", "below the lowest supported clock:");
}

static nvmlReturn_t load_profile(void)
{
    const char *path = getenv("MOCK_NVML_PROFILE");
    struct kvlist kv = {0};
    struct profile_ctx c;
    unsigned long long count;
    unsigned int i;

    if (!path || !*path)
        path = DEFAULT_PROFILE;
    if (kv_read_file(path, &kv) != 0) {
        int err = errno;
        kv_free(&kv);
        /* No profile = no GPU, no driver; an unreadable one is like /dev/nvidia* with bad modes. */
        return err == EACCES ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_DRIVER_NOT_LOADED;
    }
    c.kv = &kv;
    c.path = path;
    c.gpu = 0;
    c.ok = 1;
    if (parse_u64(kv_get(&kv, "gpu_count"), &count) != 0 || count > MAX_GPUS) {
        fprintf(stderr, "mock-nvml: %s: gpu_count missing or not in 0..%d\n", path, MAX_GPUS);
        kv_free(&kv);
        return NVML_ERROR_UNKNOWN;
    }
    for (i = 0; i < count; i++) {
        c.gpu = i;
        load_gpu(&c, &g_gpus[i]);
    }
    kv_free(&kv);
    if (!c.ok)
        return NVML_ERROR_UNKNOWN;
    g_gpu_count = (unsigned int)count;
    return NVML_SUCCESS;
}

/* ---- volatile state ------------------------------------------------------------- */

static const char *state_dir(void)
{
    const char *d = getenv("MOCK_NVML_STATE_DIR");
    return (d && *d) ? d : DEFAULT_STATE_DIR;
}

static void state_path(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", state_dir(), name);
}

static int mkdir_p(const char *dir)
{
    char buf[4096], *p;
    if (strlen(dir) >= sizeof(buf))
        return -1;
    strcpy(buf, dir);
    for (p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* Write a whole file via temp + rename so readers never see half a file. */
static int write_atomic(const char *path, const char *data)
{
    char tmp[4200];
    size_t len = strlen(data);
    int fd, ok;
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    ok = fchmod(fd, 0644) == 0 && write(fd, data, len) == (ssize_t)len;
    ok = (close(fd) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* A missing or unreadable state file simply means "everything at defaults". */
static void state_read(struct kvlist *st)
{
    char path[4200];
    state_path(path, sizeof(path), STATE_FILE);
    if (kv_read_file(path, st) != 0 && errno != ENOENT && errno != EACCES)
        fprintf(stderr, "mock-nvml: cannot read %s: %s\n", path, strerror(errno));
}

/* State keys are "<uuid>.<name>": the state belongs to the card, whatever index it gets. */
static const char *state_get(const struct kvlist *st, const struct nvmlDevice_st *g, const char *name)
{
    char key[160];
    snprintf(key, sizeof(key), "%s.%s", g->uuid, name);
    return kv_get(st, key);
}

/* Read-modify-write under an flock, since nvidia-smi, nvidia-persistenced and the
 * project's modules may all change the same card at once. val == NULL resets the key. */
static nvmlReturn_t state_put(const struct nvmlDevice_st *g, const char *name, const char *val)
{
    char path[4200], lock[4200], key[160];
    struct kvlist st = {0};
    size_t i, cap = 4096, used = 0;
    char *buf;
    int fd;
    nvmlReturn_t ret = NVML_ERROR_UNKNOWN;

    if (mkdir_p(state_dir()) != 0) {
        fprintf(stderr, "mock-nvml: cannot create %s: %s\n", state_dir(), strerror(errno));
        return NVML_ERROR_UNKNOWN;
    }
    state_path(lock, sizeof(lock), ".lock");
    fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) {
        fprintf(stderr, "mock-nvml: cannot lock %s: %s\n", lock, strerror(errno));
        if (fd >= 0)
            close(fd);
        return NVML_ERROR_UNKNOWN;
    }
    state_read(&st);
    snprintf(key, sizeof(key), "%s.%s", g->uuid, name);
    buf = malloc(cap);
    if (buf && kv_set(&st, key, val) == 0) {
        used = (size_t)snprintf(buf, cap, "# mock-nvml volatile GPU state: lost at reboot (tmpfs)\n");
        for (i = 0; buf && i < st.n; i++) {
            size_t need = strlen(st.items[i].key) + strlen(st.items[i].val) + 3;
            if (used + need >= cap) {
                char *nb = realloc(buf, cap = (used + need) * 2);
                if (!nb) {
                    free(buf);
                    buf = NULL;
                    break;
                }
                buf = nb;
            }
            used += (size_t)snprintf(buf + used, cap - used, "%s=%s\n", st.items[i].key, st.items[i].val);
        }
        state_path(path, sizeof(path), STATE_FILE);
        if (buf && write_atomic(path, buf) == 0)
            ret = NVML_SUCCESS;
        else
            fprintf(stderr, "mock-nvml: cannot write %s: %s\n", path, strerror(errno));
    }
    free(buf);
    kv_free(&st);
    flock(fd, LOCK_UN);
    close(fd);
    return ret;
}

static int state_pair(const struct kvlist *st, const struct nvmlDevice_st *g, const char *name,
                      unsigned int *a, unsigned int *b)
{
    const char *s = state_get(st, g, name);
    char tail;
    return s && sscanf(s, "%u,%u%c", a, b, &tail) == 2;
}

/* The kernel module is "loaded" by the first NVML user after boot and keeps its version
 * until reboot.  A library of a different version then refuses to talk to it. */
static nvmlReturn_t check_kernel_module(void)
{
    char path[4200], loaded[128];
    FILE *f;
    state_path(path, sizeof(path), KMOD_FILE);
    f = fopen(path, "re");
    if (f) {
        if (!fgets(loaded, sizeof(loaded), f))
            loaded[0] = '\0';
        fclose(f);
        return strcmp(trim(loaded), MOCK_DRIVER_VERSION) == 0 ? NVML_SUCCESS
                                                              : NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    }
    /* Non-root users on a fresh "boot" cannot write /run: real hosts load the module
     * through setuid nvidia-modprobe; we just carry on without recording it. */
    if (mkdir_p(state_dir()) == 0)
        write_atomic(path, MOCK_DRIVER_VERSION "\n");
    return NVML_SUCCESS;
}

/* ---- common checks -------------------------------------------------------------- */

static int valid_device(nvmlDevice_t d)
{
    return d >= g_gpus && d < g_gpus + g_gpu_count && ((char *)d - (char *)g_gpus) % sizeof(*d) == 0;
}

#define CHECK_INIT()                                                                               \
    do {                                                                                           \
        if (__atomic_load_n(&g_refcount, __ATOMIC_ACQUIRE) <= 0)                                   \
            return NVML_ERROR_UNINITIALIZED;                                                       \
    } while (0)

/* A card that fell off the bus ("<uuid>.lost=1" in the volatile state: what Xid 79 leaves
 * until the next reboot) answers nothing but NVML_ERROR_GPU_IS_LOST, its handle included,
 * while the device count still includes it, as the real driver does. */
static int device_lost(const struct nvmlDevice_st *g)
{
    struct kvlist st = {0};
    const char *s;
    int lost;
    state_read(&st);
    s = state_get(&st, g, "lost");
    lost = s && strcmp(s, "1") == 0;
    kv_free(&st);
    return lost;
}

#define CHECK_DEV(d)                                                                               \
    do {                                                                                           \
        CHECK_INIT();                                                                              \
        if (!valid_device(d))                                                                      \
            return NVML_ERROR_INVALID_ARGUMENT;                                                    \
        if (device_lost(d))                                                                        \
            return NVML_ERROR_GPU_IS_LOST;                                                         \
    } while (0)

#define CHECK_PTR(p)                                                                               \
    do {                                                                                           \
        if (!(p))                                                                                  \
            return NVML_ERROR_INVALID_ARGUMENT;                                                    \
    } while (0)

/* Changing clocks, power or persistence needs root on a real card too. */
#define CHECK_ROOT()                                                                               \
    do {                                                                                           \
        if (geteuid() != 0)                                                                        \
            return NVML_ERROR_NO_PERMISSION;                                                       \
    } while (0)

static nvmlReturn_t copy_string(char *dst, unsigned int len, const char *src)
{
    CHECK_PTR(dst);
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* The count protocol of NVML list calls: too small a buffer (or NULL) reports the size. */
static nvmlReturn_t copy_list(unsigned int *count, unsigned int *out, const unsigned int *src, unsigned int n)
{
    CHECK_PTR(count);
    if (!out || *count < n) {
        *count = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    memcpy(out, src, n * sizeof(*src));
    *count = n;
    return NVML_SUCCESS;
}

static int in_list(unsigned int v, const unsigned int *list, unsigned int n)
{
    unsigned int i;
    for (i = 0; i < n; i++)
        if (list[i] == v)
            return 1;
    return 0;
}

static void list_range(const unsigned int *list, unsigned int n, unsigned int *lo, unsigned int *hi)
{
    unsigned int i;
    *lo = *hi = list[0];
    for (i = 1; i < n; i++) {
        if (list[i] < *lo)
            *lo = list[i];
        if (list[i] > *hi)
            *hi = list[i];
    }
}

/* The highest clock the card supports that does not exceed the cap. */
static unsigned int clamp_clock(const unsigned int *list, unsigned int n, unsigned int cap)
{
    unsigned int i, best = 0, lo, hi;
    for (i = 0; i < n; i++)
        if (list[i] <= cap && list[i] > best)
            best = list[i];
    list_range(list, n, &lo, &hi);
    return best ? best : lo;
}

/* ---- what the simulated card is doing right now --------------------------------- */

static unsigned int current_gfx_clock(const struct kvlist *st, const struct nvmlDevice_st *g)
{
    unsigned int lo, hi;
    /* Locked clocks mean the card runs at (the nearest supported clock below) the
     * lock's upper bound; otherwise it idles, as nothing runs on a mock GPU. */
    if (state_pair(st, g, "locked_gfx_clocks", &lo, &hi))
        return clamp_clock(g->gfx_clocks, g->n_gfx_clocks, hi);
    return g->idle_gfx_clock;
}

static unsigned int current_mem_clock(const struct kvlist *st, const struct nvmlDevice_st *g)
{
    unsigned int lo, hi;
    if (state_pair(st, g, "locked_mem_clocks", &lo, &hi))
        return clamp_clock(g->mem_clocks, g->n_mem_clocks, hi);
    return g->max_mem_clock;
}

static unsigned int current_power_limit(const struct kvlist *st, const struct nvmlDevice_st *g)
{
    unsigned long long v;
    if (parse_u64(state_get(st, g, "power_limit_mw"), &v) == 0 && v <= 0xffffffffULL)
        return (unsigned int)v;
    return g->power_default;
}

static void app_clocks(const struct kvlist *st, const struct nvmlDevice_st *g, unsigned int *mem, unsigned int *gfx)
{
    if (!state_pair(st, g, "app_clocks", mem, gfx)) {
        *mem = g->default_app_mem;
        *gfx = g->default_app_gfx;
    }
}

static void fill_pci(const struct nvmlDevice_st *g, const struct pci_addr *p, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", p->domain & 0xffff, p->bus, p->device);
    format_bus_id(p, pci->busId, sizeof(pci->busId));
    pci->domain = p->domain;
    pci->bus = p->bus;
    pci->device = p->device;
    if (g) {
        pci->pciDeviceId = g->pci_device_id;
        pci->pciSubSystemId = g->pci_subsystem_id;
    }
}

static struct nvmlDevice_st *find_by_pci(const struct pci_addr *p)
{
    unsigned int i;
    for (i = 0; i < g_gpu_count; i++)
        if (g_gpus[i].pci.domain == p->domain && g_gpus[i].pci.bus == p->bus && g_gpus[i].pci.device == p->device)
            return &g_gpus[i];
    return NULL;
}

/* Links are shared evenly among the peers in list order; leftover links are down. */
static int nvlink_peer(const struct nvmlDevice_st *g, unsigned int link, const struct pci_addr **peer)
{
    unsigned int per_peer;
    if (!g->n_nvlink_peers)
        return 0;
    per_peer = g->nvlink_link_count / g->n_nvlink_peers;
    if (link >= per_peer * g->n_nvlink_peers)
        return 0;
    *peer = &g->nvlink_peers[link / per_peer];
    return 1;
}

/* ---- initialisation ------------------------------------------------------------- */

static const char *const k_error_strings[][2] = {
    /* strings as returned by a real R580 libnvidia-ml.so.1 */
    {"0", "Success"},
    {"1", "Uninitialized"},
    {"2", "Invalid Argument"},
    {"3", "Not Supported"},
    {"4", "Insufficient Permissions"},
    {"5", "Already Initialized"},
    {"6", "Not Found"},
    {"7", "Insufficient Size"},
    {"8", "Insufficient External Power"},
    {"9", "Driver Not Loaded"},
    {"10", "Timeout"},
    {"11", "Interrupt Request Issue"},
    {"12", "NVML Shared Library Not Found"},
    {"13", "Function Not Found"},
    {"14", "Corrupted infoROM"},
    {"15", "GPU is lost"},
    {"16", "GPU requires reset"},
    {"17", "GPU access blocked by the operating system"},
    {"18", "Driver/library version mismatch"},
    {"19", "In use by another client"},
    {"20", "Insufficient Memory"},
    {"21", "No data"},
    {"22", "vGPU ECC not supported"},
    {"23", "Insufficient Resources"},
    {"24", "Invalid Frequency"},
    {"25", "Argument version mismatch"},
    {"26", "Requested functionality has been deprecated"},
    {"27", "System is not in ready state"},
    {"28", "No supported GPUs were found"},
    {"29", "Resource not in correct state to perform requested operation"},
    {"30", "Reset type is not supported for given device"},
};

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    if (result >= 0 && (size_t)result < sizeof(k_error_strings) / sizeof(k_error_strings[0]))
        return k_error_strings[result][1];
    return "Unknown Error";
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    nvmlReturn_t ret = NVML_SUCCESS;
    (void)flags;
    big_lock();
    if (g_refcount > 0) {
        g_refcount++;
    } else {
        ret = load_profile();
        if (ret == NVML_SUCCESS)
            ret = check_kernel_module();
        if (ret == NVML_SUCCESS)
            __atomic_store_n(&g_refcount, 1, __ATOMIC_RELEASE);
    }
    big_unlock();
    return ret;
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t ret = NVML_SUCCESS;
    big_lock();
    if (g_refcount <= 0)
        ret = NVML_ERROR_UNINITIALIZED;
    else
        __atomic_store_n(&g_refcount, g_refcount - 1, __ATOMIC_RELEASE);
    big_unlock();
    return ret;
}

/* ---- system queries ------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    CHECK_INIT();
    return copy_string(version, length, MOCK_DRIVER_VERSION);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    char buf[96];
    /* e.g. "12.525.147.05": CUDA major, then the driver version. */
    snprintf(buf, sizeof(buf), "%d.%s", MOCK_CUDA_DRIVER_VERSION / 1000, MOCK_DRIVER_VERSION);
    return copy_string(version, length, buf);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    CHECK_PTR(cudaDriverVersion);
    *cudaDriverVersion = MOCK_CUDA_DRIVER_VERSION;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- device enumeration --------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    CHECK_INIT();
    CHECK_PTR(deviceCount);
    *deviceCount = g_gpu_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    CHECK_INIT();
    CHECK_PTR(device);
    if (index >= g_gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (device_lost(&g_gpus[index]))
        return NVML_ERROR_GPU_IS_LOST;
    *device = &g_gpus[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    unsigned int i;
    CHECK_INIT();
    CHECK_PTR(uuid);
    CHECK_PTR(device);
    for (i = 0; i < g_gpu_count; i++) {
        if (strcasecmp(g_gpus[i].uuid, uuid) == 0) {
            if (device_lost(&g_gpus[i]))
                return NVML_ERROR_GPU_IS_LOST;
            *device = &g_gpus[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device)
{
    unsigned int i;
    CHECK_INIT();
    CHECK_PTR(serial);
    CHECK_PTR(device);
    for (i = 0; i < g_gpu_count; i++) {
        if (strcmp(g_gpus[i].serial, serial) == 0) {
            *device = &g_gpus[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    struct pci_addr p;
    struct nvmlDevice_st *g;
    CHECK_INIT();
    CHECK_PTR(pciBusId);
    CHECK_PTR(device);
    if (parse_pci(pciBusId, &p) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    g = find_by_pci(&p);
    if (!g)
        return NVML_ERROR_NOT_FOUND;
    if (device_lost(g))
        return NVML_ERROR_GPU_IS_LOST;
    *device = g;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    CHECK_DEV(device);
    CHECK_PTR(index);
    *index = device->index;
    return NVML_SUCCESS;
}

/* ---- identity ------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    CHECK_DEV(device);
    return copy_string(name, length, device->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    CHECK_DEV(device);
    return copy_string(uuid, length, device->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    CHECK_DEV(device);
    return copy_string(serial, length, device->serial);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    CHECK_DEV(device);
    CHECK_PTR(minorNumber);
    *minorNumber = device->minor_number;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, unsigned int *type)
{
    CHECK_DEV(device);
    CHECK_PTR(type);
    *type = device->brand;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch)
{
    CHECK_DEV(device);
    CHECK_PTR(arch);
    *arch = device->arch;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    CHECK_DEV(device);
    CHECK_PTR(major);
    CHECK_PTR(minor);
    *major = device->cc_major;
    *minor = device->cc_minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    CHECK_DEV(device);
    CHECK_PTR(pci);
    fill_pci(device, &device->pci, pci);
    return NVML_SUCCESS;
}

static nvmlReturn_t pci_info_legacy(nvmlDevice_t device, nvmlPciInfo_v2_t *pci)
{
    nvmlPciInfo_t full;
    CHECK_DEV(device);
    CHECK_PTR(pci);
    fill_pci(device, &device->pci, &full);
    memset(pci, 0, sizeof(*pci));
    memcpy(pci->busId, full.busIdLegacy, sizeof(pci->busId));
    pci->domain = full.domain;
    pci->bus = full.bus;
    pci->device = full.device;
    pci->pciDeviceId = full.pciDeviceId;
    pci->pciSubSystemId = full.pciSubSystemId;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_v2_t *pci)
{
    return pci_info_legacy(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_v2_t *pci)
{
    return pci_info_legacy(device, pci);
}

/* ---- memory --------------------------------------------------------------------- */

/* Compute processes on a card: "<uuid>.processes=PID:BYTES,..." in the volatile state
 * (a test registers a process it started as holding memory).  Like the real driver,
 * only live processes count: a PID that has exited frees its memory. */
#define MAX_PROCS 64
static unsigned int card_processes(const struct nvmlDevice_st *g, nvmlProcessInfo_t *out, unsigned int max,
                                   unsigned long long *used)
{
    struct kvlist st = {0};
    const char *s;
    unsigned int n = 0;
    *used = 0;
    state_read(&st);
    s = state_get(&st, g, "processes");
    if (s && *s) {
        char buf[4096], *tok, *save = NULL, proc[64];
        snprintf(buf, sizeof(buf), "%s", s);
        for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            unsigned int pid;
            unsigned long long bytes;
            char tail;
            if (sscanf(trim(tok), "%u:%llu%c", &pid, &bytes, &tail) != 2)
                continue;
            snprintf(proc, sizeof(proc), "/proc/%u", pid);
            if (access(proc, F_OK) != 0)
                continue;
            *used += bytes;
            if (out && n < max) {
                memset(&out[n], 0, sizeof(out[n]));
                out[n].pid = pid;
                out[n].usedGpuMemory = bytes;
                out[n].gpuInstanceId = out[n].computeInstanceId = 0xFFFFFFFFu; /* no MIG */
            }
            n++;
        }
    }
    kv_free(&st);
    return n;
}

/* v1 "used" is the driver's reservation plus what processes hold (NVML documents v1
 * used as reserved + allocated); v2 reports the reservation on its own. */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    unsigned long long held;
    CHECK_DEV(device);
    CHECK_PTR(memory);
    card_processes(device, NULL, 0, &held);
    memory->total = device->mem_total;
    memory->used = device->mem_reserved + held;
    memory->free = device->mem_total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    unsigned long long held;
    CHECK_DEV(device);
    CHECK_PTR(memory);
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    card_processes(device, NULL, 0, &held);
    memory->total = device->mem_total;
    memory->reserved = device->mem_reserved;
    memory->used = held;
    memory->free = device->mem_total - device->mem_reserved - held;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory)
{
    const unsigned long long used = 2ULL << 20; /* what an idle card maps */
    CHECK_DEV(device);
    CHECK_PTR(bar1Memory);
    bar1Memory->bar1Total = device->bar1_total;
    bar1Memory->bar1Used = used < device->bar1_total ? used : 0;
    bar1Memory->bar1Free = device->bar1_total - bar1Memory->bar1Used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryBusWidth(nvmlDevice_t device, unsigned int *busWidth)
{
    CHECK_DEV(device);
    CHECK_PTR(busWidth);
    *busWidth = device->bus_width;
    return NVML_SUCCESS;
}

/* ---- clocks --------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    CHECK_DEV(device);
    CHECK_PTR(clock);
    switch (type) {
    case NVML_CLOCK_GRAPHICS: *clock = device->max_gfx_clock; return NVML_SUCCESS;
    case NVML_CLOCK_SM: *clock = device->max_sm_clock; return NVML_SUCCESS;
    case NVML_CLOCK_MEM: *clock = device->max_mem_clock; return NVML_SUCCESS;
    default: return NVML_ERROR_NOT_SUPPORTED; /* video clock: not simulated */
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    struct kvlist st = {0};
    nvmlReturn_t ret = NVML_SUCCESS;
    CHECK_DEV(device);
    CHECK_PTR(clock);
    state_read(&st);
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM: *clock = current_gfx_clock(&st, device); break;
    case NVML_CLOCK_MEM: *clock = current_mem_clock(&st, device); break;
    default: ret = NVML_ERROR_NOT_SUPPORTED;
    }
    kv_free(&st);
    return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    struct kvlist st = {0};
    unsigned int mem, gfx;
    CHECK_DEV(device);
    CHECK_PTR(clock);
    if (type > NVML_CLOCK_MEM)
        return NVML_ERROR_NOT_SUPPORTED;
    state_read(&st);
    app_clocks(&st, device, &mem, &gfx);
    kv_free(&st);
    *clock = type == NVML_CLOCK_MEM ? mem : gfx;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    CHECK_DEV(device);
    CHECK_PTR(clock);
    if (type > NVML_CLOCK_MEM)
        return NVML_ERROR_NOT_SUPPORTED;
    *clock = type == NVML_CLOCK_MEM ? device->default_app_mem : device->default_app_gfx;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, unsigned int type, unsigned int id, unsigned int *clock)
{
    switch (id) {
    case NVML_CLOCK_ID_CURRENT: return nvmlDeviceGetClockInfo(device, type, clock);
    case NVML_CLOCK_ID_APP_CLOCK_TARGET: return nvmlDeviceGetApplicationsClock(device, type, clock);
    case NVML_CLOCK_ID_APP_CLOCK_DEFAULT: return nvmlDeviceGetDefaultApplicationsClock(device, type, clock);
    case NVML_CLOCK_ID_CUSTOMER_BOOST_MAX:
        CHECK_DEV(device);
        CHECK_PTR(clock);
        if (type == NVML_CLOCK_MEM || type > NVML_CLOCK_MEM)
            return NVML_ERROR_NOT_SUPPORTED;
        *clock = type == NVML_CLOCK_SM ? device->max_sm_clock : device->max_gfx_clock;
        return NVML_SUCCESS;
    default:
        CHECK_DEV(device);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedMemoryClocks(nvmlDevice_t device, unsigned int *count, unsigned int *clocksMHz)
{
    CHECK_DEV(device);
    return copy_list(count, clocksMHz, device->mem_clocks, device->n_mem_clocks);
}

/* Every supported memory clock offers the same graphics list: true of the profiles we
 * ship (one memory clock each). */
EXPORT nvmlReturn_t nvmlDeviceGetSupportedGraphicsClocks(nvmlDevice_t device, unsigned int memoryClockMHz,
                                                         unsigned int *count, unsigned int *clocksMHz)
{
    CHECK_DEV(device);
    CHECK_PTR(count);
    if (!in_list(memoryClockMHz, device->mem_clocks, device->n_mem_clocks))
        return NVML_ERROR_NOT_FOUND;
    return copy_list(count, clocksMHz, device->gfx_clocks, device->n_gfx_clocks);
}

/* ---- power, thermals, modes ----------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *minLimit,
                                                                 unsigned int *maxLimit)
{
    CHECK_DEV(device);
    CHECK_PTR(minLimit);
    CHECK_PTR(maxLimit);
    *minLimit = device->power_min;
    *maxLimit = device->power_max;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *defaultLimit)
{
    CHECK_DEV(device);
    CHECK_PTR(defaultLimit);
    *defaultLimit = device->power_default;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    struct kvlist st = {0};
    CHECK_DEV(device);
    CHECK_PTR(limit);
    state_read(&st);
    *limit = current_power_limit(&st, device);
    kv_free(&st);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return nvmlDeviceGetPowerManagementLimit(device, limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    unsigned int limit;
    nvmlReturn_t ret = nvmlDeviceGetPowerManagementLimit(device, &limit);
    if (ret != NVML_SUCCESS)
        return ret;
    CHECK_PTR(power);
    *power = device->idle_power < limit ? device->idle_power : limit;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t device, unsigned int *mode)
{
    CHECK_DEV(device);
    CHECK_PTR(mode);
    *mode = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp)
{
    CHECK_DEV(device);
    CHECK_PTR(temp);
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = device->idle_temp;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    CHECK_DEV(device);
    CHECK_PTR(utilization);
    utilization->gpu = 0;
    utilization->memory = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, unsigned int *mode)
{
    struct kvlist st = {0};
    const char *v;
    CHECK_DEV(device);
    CHECK_PTR(mode);
    state_read(&st);
    v = state_get(&st, device, "persistence_mode");
    *mode = (v && strcmp(v, "1") == 0) ? 1 : 0;
    kv_free(&st);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, unsigned int *mode)
{
    CHECK_DEV(device);
    CHECK_PTR(mode);
    *mode = 0; /* NVML_COMPUTEMODE_DEFAULT */
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, unsigned int *pState)
{
    CHECK_DEV(device);
    CHECK_PTR(pState);
    *pState = 0; /* datacenter cards sit in P0 while a driver client is attached */
    return NVML_SUCCESS;
}

/* nvmlClocksThrottleReasonGpuIdle (0x1) while no compute process holds the card, none
 * otherwise: what an unloaded datacenter card at its default clocks reports. */
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    unsigned long long held;
    CHECK_DEV(device);
    CHECK_PTR(reasons);
    *reasons = card_processes(device, NULL, 0, &held) ? 0ULL : 0x1ULL;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, unsigned int *pState)
{
    return nvmlDeviceGetPerformanceState(device, pState);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    nvmlProcessInfo_t found[MAX_PROCS];
    unsigned long long held;
    unsigned int n;
    CHECK_DEV(device);
    CHECK_PTR(infoCount);
    n = card_processes(device, found, MAX_PROCS, &held);
    if (n > MAX_PROCS)
        n = MAX_PROCS;
    if (!infos || *infoCount < n) {
        *infoCount = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    memcpy(infos, found, n * sizeof(*found));
    *infoCount = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    return nvmlDeviceGetComputeRunningProcesses_v3(device, infoCount, infos);
}

/* ---- memory health (ECC, page retirement, row remapping) -------------------------- */

enum { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 };
enum { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 };
enum { NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1 };

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    CHECK_DEV(device);
    CHECK_PTR(current);
    CHECK_PTR(pending);
    *current = *pending = device->ecc_enabled ? 1 : 0;
    return NVML_SUCCESS;
}

/* Volatile counts ("<uuid>.ecc_uncorrected_volatile" in the tmpfs state) start again at 0
 * after a reboot; every one of them also lands in the InfoROM's aggregate. */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                                unsigned long long *eccCounts)
{
    struct kvlist st = {0};
    unsigned long long volatile_count = 0;
    const char *s;
    CHECK_DEV(device);
    CHECK_PTR(eccCounts);
    if (errorType != NVML_MEMORY_ERROR_TYPE_CORRECTED && errorType != NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (counterType != NVML_VOLATILE_ECC && counterType != NVML_AGGREGATE_ECC)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->ecc_enabled)
        return NVML_ERROR_NOT_SUPPORTED;
    state_read(&st);
    s = state_get(&st, device,
                  errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED ? "ecc_corrected_volatile" : "ecc_uncorrected_volatile");
    if (s)
        parse_u64(s, &volatile_count);
    kv_free(&st);
    *eccCounts = volatile_count;
    if (counterType == NVML_AGGREGATE_ECC)
        *eccCounts += errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED ? device->ecc_corrected_aggregate
                                                                     : device->ecc_uncorrected_aggregate;
    return NVML_SUCCESS;
}

/* Page retirement is how Volta and Turing take bad memory out of use; Ampere and later
 * remap rows instead and answer NOT_SUPPORTED here, as the real driver does. */
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, int cause, unsigned int *pageCount,
                                              unsigned long long *addresses)
{
    unsigned int n, i;
    CHECK_DEV(device);
    CHECK_PTR(pageCount);
    if (device->arch >= NVML_DEVICE_ARCH_AMPERE)
        return NVML_ERROR_NOT_SUPPORTED;
    if (cause == NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        n = device->retired_pages_sbe;
    else if (cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        n = device->retired_pages_dbe;
    else
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!addresses || *pageCount < n) {
        *pageCount = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (i = 0; i < n; i++) /* page addresses of the card, 64 KiB apart */
        addresses[i] = 0x100000ULL * (cause + 1) + 0x10000ULL * i;
    *pageCount = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, unsigned int *isPending)
{
    CHECK_DEV(device);
    CHECK_PTR(isPending);
    if (device->arch >= NVML_DEVICE_ARCH_AMPERE)
        return NVML_ERROR_NOT_SUPPORTED;
    *isPending = device->retired_pages_pending ? 1 : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                              unsigned int *isPending, unsigned int *failureOccurred)
{
    CHECK_DEV(device);
    CHECK_PTR(corrRows);
    CHECK_PTR(uncRows);
    CHECK_PTR(isPending);
    CHECK_PTR(failureOccurred);
    if (device->arch < NVML_DEVICE_ARCH_AMPERE)
        return NVML_ERROR_NOT_SUPPORTED;
    *corrRows = device->remapped_rows_correctable;
    *uncRows = device->remapped_rows_uncorrectable;
    *isPending = device->remapped_rows_pending ? 1 : 0;
    *failureOccurred = device->remapped_rows_failure ? 1 : 0;
    return NVML_SUCCESS;
}

/* ---- topology ------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    CHECK_DEV(device);
    CHECK_PTR(node);
    if (device->numa_node < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned int)device->numa_node;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet)
{
    unsigned int i;
    CHECK_DEV(device);
    CHECK_PTR(cpuSet);
    if (cpuSetSize == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* unsigned long is 64 bits on every Linux target this harness runs on. */
    for (i = 0; i < cpuSetSize; i++)
        cpuSet[i] = i < CPU_WORDS ? (unsigned long)device->cpu_affinity[i] : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, unsigned int *isActive)
{
    const struct pci_addr *peer;
    CHECK_DEV(device);
    CHECK_PTR(isActive);
    if (!device->nvlink_link_count)
        return NVML_ERROR_NOT_SUPPORTED; /* PCIe cards have no NVLink */
    if (link >= device->nvlink_link_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = (unsigned int)nvlink_peer(device, link, &peer);
    return NVML_SUCCESS;
}

/* Error counters of an active link ("<uuid>.nvlink_errors=REPLAY,RECOVERY,CRC_FLIT,CRC_DATA"
 * in the volatile state, the same on every link; 0 when unset), as a healthy link reports. */
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, int counter,
                                                    unsigned long long *counterValue)
{
    const struct pci_addr *peer;
    struct kvlist st = {0};
    unsigned long long v[5] = {0, 0, 0, 0, 0};
    const char *s;
    CHECK_DEV(device);
    CHECK_PTR(counterValue);
    if (!device->nvlink_link_count)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= device->nvlink_link_count || counter < 0 || counter > 4)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!nvlink_peer(device, link, &peer))
        return NVML_ERROR_NOT_SUPPORTED; /* an inactive link has no counters */
    state_read(&st);
    s = state_get(&st, device, "nvlink_errors");
    if (s)
        sscanf(s, "%llu,%llu,%llu,%llu,%llu", &v[0], &v[1], &v[2], &v[3], &v[4]);
    kv_free(&st);
    *counterValue = v[counter];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version)
{
    CHECK_DEV(device);
    CHECK_PTR(version);
    if (!device->nvlink_link_count)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= device->nvlink_link_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = device->nvlink_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    const struct pci_addr *peer;
    CHECK_DEV(device);
    CHECK_PTR(pci);
    if (!device->nvlink_link_count)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= device->nvlink_link_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!nvlink_peer(device, link, &peer))
        return NVML_ERROR_NOT_SUPPORTED; /* link down: nothing at the other end */
    fill_pci(find_by_pci(peer), peer, pci);
    return NVML_SUCCESS;
}

/* ---- setters -------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceSetPersistenceMode(nvmlDevice_t device, unsigned int mode)
{
    CHECK_DEV(device);
    CHECK_ROOT();
    if (mode > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    return state_put(device, "persistence_mode", mode ? "1" : NULL);
}

static nvmlReturn_t lock_clocks(nvmlDevice_t device, const char *key, const unsigned int *list, unsigned int n,
                                unsigned int minMHz, unsigned int maxMHz)
{
    unsigned int lo, hi;
    char val[32];
    list_range(list, n, &lo, &hi);
    if (minMHz > maxMHz || minMHz < lo || maxMHz > hi)
        return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(val, sizeof(val), "%u,%u", minMHz, maxMHz);
    return state_put(device, key, val);
}

EXPORT nvmlReturn_t nvmlDeviceSetGpuLockedClocks(nvmlDevice_t device, unsigned int minGpuClockMHz,
                                                 unsigned int maxGpuClockMHz)
{
    CHECK_DEV(device);
    if (device->arch < NVML_DEVICE_ARCH_VOLTA)
        return NVML_ERROR_NOT_SUPPORTED; /* NVML: Volta or newer */
    CHECK_ROOT();
    return lock_clocks(device, "locked_gfx_clocks", device->gfx_clocks, device->n_gfx_clocks, minGpuClockMHz,
                       maxGpuClockMHz);
}

EXPORT nvmlReturn_t nvmlDeviceResetGpuLockedClocks(nvmlDevice_t device)
{
    CHECK_DEV(device);
    if (device->arch < NVML_DEVICE_ARCH_VOLTA)
        return NVML_ERROR_NOT_SUPPORTED;
    CHECK_ROOT();
    return state_put(device, "locked_gfx_clocks", NULL);
}

/* NVML documents memory clock locking for Ampere or newer: a V100 or T4 says Not Supported. */
EXPORT nvmlReturn_t nvmlDeviceSetMemoryLockedClocks(nvmlDevice_t device, unsigned int minMemClockMHz,
                                                    unsigned int maxMemClockMHz)
{
    CHECK_DEV(device);
    if (device->arch < NVML_DEVICE_ARCH_AMPERE)
        return NVML_ERROR_NOT_SUPPORTED;
    CHECK_ROOT();
    return lock_clocks(device, "locked_mem_clocks", device->mem_clocks, device->n_mem_clocks, minMemClockMHz,
                       maxMemClockMHz);
}

EXPORT nvmlReturn_t nvmlDeviceResetMemoryLockedClocks(nvmlDevice_t device)
{
    CHECK_DEV(device);
    if (device->arch < NVML_DEVICE_ARCH_AMPERE)
        return NVML_ERROR_NOT_SUPPORTED;
    CHECK_ROOT();
    return state_put(device, "locked_mem_clocks", NULL);
}

/* Application clocks must be an exact supported (memory, graphics) pair. */
EXPORT nvmlReturn_t nvmlDeviceSetApplicationsClocks(nvmlDevice_t device, unsigned int memClockMHz,
                                                    unsigned int graphicsClockMHz)
{
    char val[32];
    CHECK_DEV(device);
    CHECK_ROOT();
    if (!in_list(memClockMHz, device->mem_clocks, device->n_mem_clocks) ||
        !in_list(graphicsClockMHz, device->gfx_clocks, device->n_gfx_clocks))
        return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(val, sizeof(val), "%u,%u", memClockMHz, graphicsClockMHz);
    return state_put(device, "app_clocks", val);
}

EXPORT nvmlReturn_t nvmlDeviceResetApplicationsClocks(nvmlDevice_t device)
{
    CHECK_DEV(device);
    CHECK_ROOT();
    return state_put(device, "app_clocks", NULL);
}

EXPORT nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t device, unsigned int limit)
{
    char val[32];
    CHECK_DEV(device);
    CHECK_ROOT();
    if (limit < device->power_min || limit > device->power_max)
        return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(val, sizeof(val), "%u", limit);
    return state_put(device, "power_limit_mw", val);
}

/* ---- events (Xid) ----------------------------------------------------------------- */

/* The driver's Xid reports: "<state dir>/xid_events", one "<uuid> <xid>" line per event,
 * appended by a test as the kernel driver would raise them (and lost at reboot with the
 * rest of the volatile state).  As with the real library, a set sees only the events
 * raised after it was created, for the devices and types registered on it. */
#define XID_FILE "xid_events"
enum { nvmlEventTypeXidCriticalError = 0x8ULL };
#define NVML_ERROR_TIMEOUT 10

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

struct nvmlEventSet_st {
    long offset; /* bytes of XID_FILE already seen */
    unsigned long long types[MAX_GPUS];
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;

/* lseek, not stat: glibc >= 2.33 binds stat() to stat@GLIBC_2.33, which the oldest
 * supported hosts (glibc 2.31) lack, and dlopen would then fail there. */
static long xid_file_size(void)
{
    char path[4200];
    off_t size;
    int fd;
    state_path(path, sizeof(path), XID_FILE);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size = lseek(fd, 0, SEEK_END);
    close(fd);
    return size < 0 ? 0 : (long)size;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    CHECK_DEV(device);
    CHECK_PTR(eventTypes);
    *eventTypes = nvmlEventTypeXidCriticalError;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    CHECK_INIT();
    CHECK_PTR(set);
    *set = calloc(1, sizeof(**set));
    if (!*set)
        return NVML_ERROR_UNKNOWN;
    (*set)->offset = xid_file_size();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    CHECK_DEV(device);
    CHECK_PTR(set);
    if (eventTypes & ~(unsigned long long)nvmlEventTypeXidCriticalError)
        return NVML_ERROR_NOT_SUPPORTED;
    set->types[device->index] |= eventTypes;
    return NVML_SUCCESS;
}

/* The next event of the set, waiting up to timeoutms (polling the file: the simulated
 * driver has no interrupt to wake us). */
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    char path[4200], line[256], uuid[96];
    unsigned int waited = 0, i;
    unsigned long long xid;
    CHECK_INIT();
    CHECK_PTR(set);
    CHECK_PTR(data);
    state_path(path, sizeof(path), XID_FILE);
    for (;;) {
        FILE *f = fopen(path, "re");
        if (f && xid_file_size() < set->offset)
            set->offset = 0; /* the file was cleared (a reboot): read it from the start */
        if (f && fseek(f, set->offset, SEEK_SET) == 0) {
            while (fgets(line, sizeof(line), f) && strchr(line, '\n')) {
                set->offset = ftell(f);
                if (sscanf(line, "%95s %llu", uuid, &xid) != 2)
                    continue;
                for (i = 0; i < g_gpu_count; i++) {
                    if (strcmp(g_gpus[i].uuid, uuid) != 0 ||
                        !(set->types[i] & nvmlEventTypeXidCriticalError))
                        continue;
                    memset(data, 0, sizeof(*data));
                    data->device = &g_gpus[i];
                    data->eventType = nvmlEventTypeXidCriticalError;
                    data->eventData = xid;
                    data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
                    fclose(f);
                    return NVML_SUCCESS;
                }
            }
        }
        if (f)
            fclose(f);
        if (waited >= timeoutms)
            return NVML_ERROR_TIMEOUT;
        usleep(50000);
        waited += 50;
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    free(set);
    return NVML_SUCCESS;
}
