/* A "training" binary built against the CUDA 12 runtime (libcudart.so.12). */
#include <stdio.h>

int cudaGetDeviceCount(int *count);

int main(void) {
    int n = 0;
    int err = cudaGetDeviceCount(&n);
    printf("cudaGetDeviceCount -> %d, %d device(s)\n", err, n);
    return err != 0;
}
