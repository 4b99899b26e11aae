//! Compiles `proto/*.proto` with a vendored protoc, so no system package is needed.
fn main() {
    let protoc = protoc_bin_vendored::protoc_bin_path().expect("vendored protoc is available");
    println!("cargo:rerun-if-changed=proto");
    prost_build::Config::new()
        .protoc_executable(&protoc)
        .compile_protos(
            &["proto/job_graph.proto", "proto/checkpoint.proto"],
            &["proto"],
        )
        .expect("compile protos");

    // gRPC services: byte fields as `Bytes`, so keys and values move without copies.
    let mut config = prost_build::Config::new();
    config.protoc_executable(&protoc).bytes(["."]);
    tonic_prost_build::configure()
        .compile_with_config(
            config,
            &["proto/state_service.proto", "proto/cluster.proto"],
            &["proto"],
        )
        .expect("compile service protos");
}
