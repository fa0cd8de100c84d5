// A CUDA kernel built with nvcc (when present), dynamically linked against the toolkit's libcudart.
#include <cstdio>

__global__ void saxpy(int n, float a, const float *x, float *y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

int main() {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    std::printf("%s, %d device(s)\n", cudaGetErrorString(err), n);
    if (n > 0) saxpy<<<1, 32>>>(0, 2.0f, nullptr, nullptr);
    return 0;
}
