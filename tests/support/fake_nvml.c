/* A stand-in for libnvidia-ml with four GPUs (sm 9.0) on buses 0000:1a..1d:00.0: GPU0-GPU1 and GPU2-GPU3 bonded by
 * 4 NVLinks each, every GPU with 2 NVLinks to one NVSwitch (0000:f0:00.0). Lets the tests drive hopwise's dlopen
 * path on machines without a GPU; only the entry points hopwise calls exist. */
#include <stdio.h>
#include <string.h>

typedef struct {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
} PciInfo;

enum { kGpus = 4 };
static int initialized;

/* Link l of GPU g: 0-3 to the partner GPU (g ^ 1), 4-5 to the switch, the rest inactive. */
static int partner(int g) { return g ^ 1; }

int nvmlInit_v2(void) { initialized = 1; return 0; }
int nvmlShutdown(void) { initialized = 0; return 0; }
int nvmlDeviceGetCount_v2(unsigned* n) { if (!initialized) return 1; *n = kGpus; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** d) {
  if (i >= kGpus) return 2;
  *d = (void*)(unsigned long)(i + 1);
  return 0;
}
static int index_of(void* d) { return (int)(unsigned long)d - 1; }
static void fill(PciInfo* p, unsigned bus) {
  memset(p, 0, sizeof *p);
  p->bus = bus;
  snprintf(p->bus_id, sizeof p->bus_id, "00000000:%02X:00.0", bus);
  snprintf(p->bus_id_legacy, sizeof p->bus_id_legacy, "0000:%02X:00.0", bus);
}
int nvmlDeviceGetName(void* d, char* name, unsigned len) { snprintf(name, len, "Fake H100 %d", index_of(d)); return 0; }
int nvmlDeviceGetPciInfo_v3(void* d, PciInfo* p) { fill(p, 0x1a + (unsigned)index_of(d)); return 0; }
int nvmlDeviceGetCudaComputeCapability(void* d, int* major, int* minor) { (void)d; *major = 9; *minor = 0; return 0; }
int nvmlDeviceGetNvLinkState(void* d, unsigned link, int* active) {
  (void)d;
  if (link >= 18) return 2;
  *active = link < 6;
  return 0;
}
int nvmlDeviceGetNvLinkRemotePciInfo_v2(void* d, unsigned link, PciInfo* p) {
  if (link >= 6) return 2;
  fill(p, link < 4 ? 0x1a + (unsigned)partner(index_of(d)) : 0xf0);
  return 0;
}
int nvmlDeviceGetNvLinkRemoteDeviceType(void* d, unsigned link, int* type) {
  (void)d;
  if (link >= 6) return 2;
  *type = link < 4 ? 0 : 2;
  return 0;
}
