//! Bad input on the wire: oversized and malformed messages get an error, and the node keeps
//! serving everyone else.

use std::io::{Read, Write};
use std::time::Duration;

use cluster_tests::{Cluster, channel, ops};
use conch_proto::conch::PeerMessage;
use conch_proto::conch::conch_peer_client::ConchPeerClient;
use conch_proto::grackle as pb;
use tonic::codegen::http::uri::PathAndQuery;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_malformed_messages_are_refused_and_the_node_keeps_serving()
-> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await?;
    let mut c = cluster.grackle(leader).await?;
    ops::namespace(&mut c, "ok").await?;

    // A request over the 4 MiB limit.
    let huge = pb::CreateNamespaceRequest {
        name: "big".into(),
        description: "x".repeat(5 << 20),
        ..Default::default()
    };
    let status = c
        .create_namespace(huge)
        .await
        .expect_err("oversized request");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");

    // Bytes that are not a CreateNamespaceRequest: field 1 (name) is not valid UTF-8.
    let mut grpc = tonic::client::Grpc::new(channel(&cluster.addr(leader)).await?);
    grpc.ready().await?;
    let codec = tonic_prost::ProstCodec::<PeerMessage, pb::CreateNamespaceResponse>::default();
    let path = PathAndQuery::from_static("/com.evrblk.grackle.v1beta.GrackleApi/CreateNamespace");
    let garbage = PeerMessage {
        payload: vec![0xff, 0xfe, 0x80, 0x00, 0xc3],
    };
    let status = grpc
        .unary(tonic::Request::new(garbage), path, codec)
        .await
        .expect_err("malformed request");
    assert!(
        matches!(
            status.code(),
            tonic::Code::Internal | tonic::Code::InvalidArgument
        ),
        "{status:?}"
    );

    // A peer message that does not decode (from this cluster: a message without the cluster's
    // id is refused before it is read).
    let cluster_id = cluster.status(leader).await?.cluster_id;
    let from_cluster = |payload: Vec<u8>| {
        let mut request = tonic::Request::new(PeerMessage { payload });
        if let Ok(id) = cluster_id.parse() {
            request.metadata_mut().insert("conch-cluster-id", id);
        }
        request
    };
    let mut peer = ConchPeerClient::new(channel(&cluster.addr(leader)).await?);
    let status = peer
        .propose(from_cluster(vec![0xde, 0xad, 0xbe, 0xef, 1, 2, 3]))
        .await
        .expect_err("malformed peer message");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let status = peer
        .append_entries(from_cluster(vec![7; 64]))
        .await
        .expect_err("malformed append");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    // The same on the AppendEntries stream: the malformed message's error ends it.
    let stream = futures::stream::iter([PeerMessage {
        payload: vec![7; 64],
    }]);
    let request = from_cluster(Vec::new()).map(|_| stream);
    let mut replies = peer.append_entries_stream(request).await?.into_inner();
    let status = replies
        .message()
        .await
        .expect_err("malformed streamed append");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    // And on the forward stream.
    let stream = futures::stream::iter([PeerMessage {
        payload: vec![0xde, 0xad, 0xbe, 0xef, 1, 2, 3],
    }]);
    let request = from_cluster(Vec::new()).map(|_| stream);
    let mut replies = peer.propose_stream(request).await?.into_inner();
    let status = replies
        .message()
        .await
        .expect_err("malformed streamed proposal");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    // Raw bytes that are not HTTP/2 at all: the node closes that connection.
    let mut raw = std::net::TcpStream::connect(cluster.addr(leader))?;
    raw.set_read_timeout(Some(Duration::from_secs(10)))?;
    raw.write_all(&[0x5a; 64 * 1024])?;
    let mut sink = Vec::new();
    let _ = raw.read_to_end(&mut sink);

    // Nothing above changed anything or hurt the node: it still serves, and agrees with the others.
    ops::namespace(&mut c, "still-serving").await?;
    let names: Vec<String> = c
        .list_namespaces(pb::ListNamespacesRequest::default())
        .await?
        .into_inner()
        .namespaces
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, vec!["ok".to_string(), "still-serving".to_string()]);
    cluster.wait_for_agreement(Duration::from_secs(10)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_name_the_field_and_change_nothing() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let mut c = cluster.grackle(2).await?;
    ops::namespace(&mut c, "v").await?;
    ops::semaphore(&mut c, "v", "s", 2).await?;
    let lease = ops::lease(&mut c, "v", 30).await?;
    let before = cluster.wait_for_agreement(Duration::from_secs(10)).await?;

    // Invalid on their face: refused before they reach the log.
    let cases: Vec<(tonic::Status, &str)> = vec![
        (
            ops::namespace(&mut c, "bad name!")
                .await
                .expect_err("bad name"),
            "name",
        ),
        (
            ops::semaphore(&mut c, "v", "s2", 0)
                .await
                .expect_err("zero permits"),
            "permits",
        ),
        (
            ops::lease(&mut c, "v", 0).await.expect_err("zero ttl"),
            "ttl_seconds",
        ),
        (
            ops::lease(&mut c, "v", 301)
                .await
                .expect_err("ttl too long"),
            "ttl_seconds",
        ),
        (
            ops::acquire(&mut c, "v", "s", &lease, 1, 301)
                .await
                .expect_err("timeout too long"),
            "timeout_seconds",
        ),
        (
            ops::acquire(&mut c, "v", "s", &lease, 1, -1)
                .await
                .expect_err("negative timeout"),
            "timeout_seconds",
        ),
    ];
    for (status, field) in cases {
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains(field),
            "{field}: {}",
            status.message()
        );
    }
    let page = c
        .list_namespaces(pb::ListNamespacesRequest {
            limit: 251,
            ..Default::default()
        })
        .await
        .expect_err("limit too large");
    assert_eq!(page.code(), tonic::Code::InvalidArgument);
    let token = c
        .list_namespaces(pb::ListNamespacesRequest {
            pagination_token: "garbage".into(),
            ..Default::default()
        })
        .await
        .expect_err("bad cursor");
    assert!(
        token.message().contains("pagination_token"),
        "{}",
        token.message()
    );
    let after = cluster.wait_for_agreement(Duration::from_secs(10)).await?;
    assert_eq!(before, after, "refused requests must not reach the log");

    // Invalid against the state (decided in log order): refused, and the state is as before.
    let status = ops::acquire(&mut c, "v", "s", &lease, 3, 0)
        .await
        .expect_err("weight over permits");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("weight exceeds semaphore permits"),
        "{}",
        status.message()
    );
    let missing = ops::acquire(&mut c, "v", "s", "ls_nope", 1, 0)
        .await
        .expect_err("unknown lease");
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let sem = c
        .get_semaphore(pb::GetSemaphoreRequest {
            namespace_name: "v".into(),
            semaphore_name: "s".into(),
        })
        .await?
        .into_inner()
        .semaphore
        .unwrap_or_default();
    assert_eq!(
        (
            sem.active_holds,
            sem.active_holders_count,
            sem.waiters_count,
            sem.version
        ),
        (0, 0, 0, 1)
    );
    assert!(ops::holders(&mut c, "v", "s").await?.is_empty());
    Ok(())
}
