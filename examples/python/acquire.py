"""Takes one slot of a conch semaphore with plain grpcio, the way any Grackle client does.

    python3 -m pip install grpcio grpcio-tools
    python3 -m grpc_tools.protoc -I proto/proto --python_out=examples/python \
        --grpc_python_out=examples/python proto/proto/grackle.proto
    python3 examples/python/acquire.py 127.0.0.1:7001

With access control on, set CONCH_TOKEN: it is sent as `authorization: Bearer <token>`.
"""

import os
import sys

import grpc

import grackle_pb2 as pb
import grackle_pb2_grpc as rpc


def main() -> int:
    target = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7001"
    token = os.environ.get("CONCH_TOKEN")
    metadata = [("authorization", f"Bearer {token}")] if token else []
    api = rpc.GrackleApiStub(grpc.insecure_channel(target))

    def call(method, request):
        return method(request, metadata=metadata, timeout=10)

    try:
        call(api.CreateNamespace, pb.CreateNamespaceRequest(name="examples"))
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.ALREADY_EXISTS:
            raise
    try:
        call(
            api.CreateSemaphore,
            pb.CreateSemaphoreRequest(
                namespace_name="examples", semaphore_name="nightly", permits=1
            ),
        )
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.ALREADY_EXISTS:
            raise
    lease = call(
        api.CreateSemaphoreLease,
        pb.CreateSemaphoreLeaseRequest(
            namespace_name="examples", process_id="acquire.py", ttl_seconds=10
        ),
    ).lease
    acquired = call(
        api.AcquireSemaphore,
        pb.AcquireSemaphoreRequest(
            namespace_name="examples",
            semaphore_name="nightly",
            lease_id=lease.lease_id,
            weight=1,
            timeout_seconds=30,
        ),
    )
    if acquired.outcome != pb.ACQUIRE_OUTCOME_ACQUIRED:
        print("no slot within 30 s", file=sys.stderr)
        call(api.RevokeSemaphoreLease, pb.RevokeSemaphoreLeaseRequest(
            namespace_name="examples", lease_id=lease.lease_id))
        return 75
    # conch's extension field 100: the grant's fencing token (plain Grackle clients ignore it).
    print(f"holding examples/nightly with lease {lease.lease_id}, fencing token {acquired.fencing_token}")
    call(api.RevokeSemaphoreLease, pb.RevokeSemaphoreLeaseRequest(
        namespace_name="examples", lease_id=lease.lease_id))
    print("released")
    return 0


if __name__ == "__main__":
    sys.exit(main())
