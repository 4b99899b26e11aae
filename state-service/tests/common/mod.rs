//! Test helpers: a node on 127.0.0.1:0 with its own data directory, a real tonic client,
//! and state keys and ops built from text.

#![allow(dead_code)]

use std::path::Path;

use bytes::Bytes;
use sluice_common::pb::state::state_service_client::StateServiceClient;
use sluice_common::pb::state::{
    CommitRequest, FlushRequest, MultiGetRequest, OpenShardRequest, RollbackRequest, ScanRequest,
    ShardId, WriteOp, WriteRequest, write_op,
};
use sluice_common::state::key::encode_key;
use sluice_state_service::{RunningStateService, StateServiceConfig};
use tonic::transport::Channel;

pub type Client = StateServiceClient<Channel>;

pub fn config(data_dir: &Path, url: &str) -> StateServiceConfig {
    StateServiceConfig {
        node_id: "test".into(),
        data_dir: data_dir.to_path_buf(),
        object_store_url: url.to_string(),
        memory_bytes: 64 << 20,
        disk_cache_bytes: 16 << 20,
        ..StateServiceConfig::default()
    }
}

pub async fn start(cfg: StateServiceConfig) -> (RunningStateService, Client) {
    let node = sluice_state_service::start(cfg).await.expect("start node");
    let client = StateServiceClient::connect(format!("http://{}", node.local_addr()))
        .await
        .expect("connect");
    (node, client)
}

pub fn shard(job: &str, start: u32, end: u32) -> ShardId {
    ShardId {
        job_id: job.into(),
        key_group_start: start,
        key_group_end: end,
    }
}

/// State key of user key `k` in key group `kg` (operator 1, state "s").
pub fn key(kg: u16, k: &str) -> Bytes {
    encode_key(kg, 1, b"s", k.as_bytes(), b"")
}

pub fn put(kg: u16, k: &str, v: &str) -> WriteOp {
    WriteOp {
        kind: write_op::Kind::Put as i32,
        key: key(kg, k),
        value: Bytes::copy_from_slice(v.as_bytes()),
        end: Bytes::new(),
    }
}

pub fn del(kg: u16, k: &str) -> WriteOp {
    WriteOp {
        kind: write_op::Kind::Delete as i32,
        key: key(kg, k),
        ..Default::default()
    }
}

pub fn merge(kg: u16, k: &str, v: &str) -> WriteOp {
    WriteOp {
        kind: write_op::Kind::Merge as i32,
        key: key(kg, k),
        value: Bytes::copy_from_slice(v.as_bytes()),
        end: Bytes::new(),
    }
}

/// Deletes every key of key groups `[from, to)`.
pub fn del_groups(from: u16, to: u16) -> WriteOp {
    WriteOp {
        kind: write_op::Kind::DeleteRange as i32,
        key: Bytes::copy_from_slice(&from.to_be_bytes()),
        end: Bytes::copy_from_slice(&to.to_be_bytes()),
        value: Bytes::new(),
    }
}

pub async fn open(c: &mut Client, s: &ShardId, checkpoint: u64) -> (u64, bool, u64) {
    let r = c
        .open_shard(OpenShardRequest {
            fence: 0,
            shard: Some(s.clone()),
            checkpoint_id: checkpoint,
            ttl_states: vec![],
        })
        .await
        .expect("open shard")
        .into_inner();
    (
        r.checkpoint_id,
        r.restored_from_object_store,
        r.restore_bytes,
    )
}

pub async fn write(c: &mut Client, s: &ShardId, epoch: u64, ops: Vec<WriteOp>) {
    c.write(WriteRequest {
        fence: 0,
        shard: Some(s.clone()),
        epoch,
        ops,
    })
    .await
    .expect("write");
}

pub async fn flush(c: &mut Client, s: &ShardId, epoch: u64) -> String {
    c.flush(FlushRequest {
        fence: 0,
        shard: Some(s.clone()),
        epoch,
    })
    .await
    .expect("flush")
    .into_inner()
    .handle
}

pub async fn commit(c: &mut Client, s: &ShardId, cp: u64, retained: Vec<u64>) -> String {
    c.commit(CommitRequest {
        shard: Some(s.clone()),
        checkpoint_id: cp,
        retained,
    })
    .await
    .expect("commit")
    .into_inner()
    .manifest
}

pub async fn rollback(c: &mut Client, s: &ShardId, cp: u64) -> u64 {
    c.rollback(RollbackRequest {
        fence: 0,
        shard: Some(s.clone()),
        checkpoint_id: cp,
    })
    .await
    .expect("rollback")
    .into_inner()
    .undone
}

/// Values of user keys `(kg, k)` as strings, `None` when absent.
pub async fn get(c: &mut Client, s: &ShardId, keys: &[(u16, &str)]) -> Vec<Option<String>> {
    let r = c
        .multi_get(MultiGetRequest {
            shard: Some(s.clone()),
            keys: keys.iter().map(|(g, k)| key(*g, k)).collect(),
        })
        .await
        .expect("multi_get")
        .into_inner();
    r.values
        .iter()
        .zip(&r.found)
        .map(|(v, f)| f.then(|| String::from_utf8_lossy(v).into_owned()))
        .collect()
}

/// Every entry of the shard, paging with `page`.
pub async fn scan_all(c: &mut Client, s: &ShardId, page: u32) -> Vec<(Bytes, Bytes)> {
    let mut out = Vec::new();
    let mut start = Bytes::new();
    loop {
        let r = c
            .scan(ScanRequest {
                shard: Some(s.clone()),
                start: start.clone(),
                end: Bytes::new(),
                limit: page,
            })
            .await
            .expect("scan")
            .into_inner();
        assert!(page == 0 || r.keys.len() <= page as usize);
        out.extend(r.keys.into_iter().zip(r.values));
        if !r.more {
            return out;
        }
        start = r.resume_key;
    }
}

pub fn some(v: &str) -> Option<String> {
    Some(v.to_string())
}
