/* A stand-in for the driver's libnvidia-ml.so.1 on machines without a GPU:
 * two GPUs with fixed readings, so that the worker's run-time loading of
 * NVML and its GPU series are tested where no driver is. The entry points
 * and their C signatures are NVML's. */
#include <stdio.h>
#include <string.h>

typedef struct {
  unsigned int gpu, memory;
} Utilization;
typedef struct {
  unsigned long long total, free, used;
} Memory;

int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = 2;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  *device = (void*)(unsigned long)(index + 1);
  return 0;
}
static unsigned int Index(void* device) {
  return (unsigned int)(unsigned long)device - 1;
}
int nvmlDeviceGetUUID(void* device, char* uuid, unsigned int length) {
  snprintf(uuid, length, "GPU-fake-%u", Index(device));
  return 0;
}
int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  u->gpu = 37 + Index(device);
  u->memory = 5;
  return 0;
}
int nvmlDeviceGetMemoryInfo(void* device, Memory* m) {
  (void)device;
  m->total = 80ULL << 30;
  m->used = 1ULL << 30;
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetTemperature(void* device, int sensor, unsigned int* celsius) {
  (void)sensor;
  *celsius = 41 + Index(device);
  return 0;
}
