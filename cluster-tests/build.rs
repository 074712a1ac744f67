//! Generates the etcd v3 client the benchmark's etcd baseline uses, with the same vendored
//! `protoc` as the wire contract, so no system protobuf compiler is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment here.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&["proto/etcd.proto"], &["proto"])?;
    // The one file, not the directory: another file appearing there rebuilds nothing.
    println!("cargo:rerun-if-changed=proto/etcd.proto");
    Ok(())
}
