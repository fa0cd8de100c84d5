/* The incident's binary: built on a workstation whose default CUDA was 13.0, so it links
 * libcublas.so.13 and libcudart.so.13 -- which the CUDA 12.9 deployment image does not have. */
#include <stdio.h>

int cublasCreate_v2(void **handle);
int cudaGetDeviceCount(int *count);

int main(void) {
    void *handle = 0;
    int n = 0;
    printf("cudaGetDeviceCount -> %d (%d), cublasCreate -> %d\n", cudaGetDeviceCount(&n), n,
           cublasCreate_v2(&handle));
    return 0;
}
