// A one-rank NCCL for the emulated build (make test-gpu-emu): enough of the
// API pkg/comm/nccl.c calls for the trainer's "NCCL at world size 1" checks
// to run on the CPU. Like the real library at one rank, a collective copies
// (or leaves) the buffer as it is -- an average over one rank is the value
// itself -- and it refuses what NCCL refuses: a communicator of more than
// one rank (nothing to talk to here), and buffers that are not device
// memory (NCCL's argument check; a host pointer would fault in a kernel).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>

struct ncclComm {
    int nranks;
};

namespace {
size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}
bool on_device(const void *p) {
    cudaPointerAttributes a;
    return cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeDevice;
}
ncclResult_t copy(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    if (count && (!on_device(send) || !on_device(recv))) return ncclInvalidArgument;
    if (send != recv) memmove(recv, send, count * type_size(t));
    return ncclSuccess;
}
} // namespace

extern "C" {
ncclResult_t ncclGetVersion(int *v) {
    *v = NCCL_VERSION_CODE;
    return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *c, int nranks, ncclUniqueId, int rank,
                                    ncclConfig_t *) {
    *c = nullptr;
    if (nranks != 1 || rank != 0) return ncclInvalidUsage; // one rank only, in emulation
    *c = (ncclComm_t)calloc(1, sizeof(ncclComm));
    (*c)->nranks = 1;
    return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *st) {
    *st = ncclSuccess;
    return c ? ncclSuccess : ncclInvalidArgument;
}
const char *ncclGetLastError(ncclComm_t) { return ""; }
const char *ncclGetErrorString(ncclResult_t r) {
    return r == ncclSuccess ? "no error" : "error (emulated NCCL)";
}
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t,
                           ncclComm_t c, cudaStream_t) {
    return copy(s, r, n, t, c);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root,
                           ncclComm_t c, cudaStream_t) {
    return root == 0 ? copy(s, r, n, t, c) : ncclInvalidArgument;
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t) {
    return copy(s, r, n, t, c);
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t,
                               ncclComm_t c, cudaStream_t) {
    return copy(s, r, n, t, c);
}
ncclResult_t ncclCommFinalize(ncclComm_t c) { return c ? ncclSuccess : ncclInvalidArgument; }
ncclResult_t ncclCommDestroy(ncclComm_t c) {
    free(c);
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t c) {
    free(c);
    return ncclSuccess;
}
}
