//! Compiles the subset of etcd's v3 API the coordinators elect their leader with
//! (`proto/etcd/`), with a vendored protoc, so no system package is needed.
fn main() {
    let protoc = protoc_bin_vendored::protoc_bin_path().expect("vendored protoc is available");
    println!("cargo:rerun-if-changed=proto");
    let mut config = prost_build::Config::new();
    config.protoc_executable(&protoc);
    tonic_prost_build::configure()
        .build_server(false)
        .compile_with_config(
            config,
            &[
                "proto/etcd/kv.proto",
                "proto/etcd/rpc.proto",
                "proto/etcd/election.proto",
            ],
            &["proto"],
        )
        .expect("compile etcd protos");
}
