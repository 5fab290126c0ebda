//! kubeovn-ovn's pure parts (criterion): framing decode of a large update notification, datum parsing,
//! update parsing by schema (through a `serde_json::Value` tree, as before, and directly from the text, as the
//! client now does), cache apply and lookups. No server: the end-to-end figures (initial sync of a
//! 200,000-row database, round trips, batched inserts beside the peers) are kube-ovn-bench's `nb` mode.
//!
//! `cargo bench -p kubeovn-benches --bench ovsdb -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kubeovn_ovn::cache::CacheBuilder;
use kubeovn_ovn::framing::FrameDecoder;
use kubeovn_ovn::monitor::{parse_table_updates, parse_table_updates_str};
use kubeovn_ovn::serde_json::{self, json, Value as Json};
use kubeovn_ovn::{DatabaseSchema, Datum};

const N: usize = 5_000;

fn schema() -> DatabaseSchema {
    include_str!("../../kubeovn-ovn/schemas/ovn-nb.ovsschema")
        .parse()
        .expect("schema")
}

fn uuid(i: usize) -> String {
    format!("{:08x}-0000-4000-8000-{:012x}", i, i)
}

/// `<table-updates2>` inserting N switch ports shaped as Kube-OVN's.
fn updates() -> Json {
    let mut rows = serde_json::Map::new();
    for i in 0..N {
        rows.insert(
            uuid(i),
            json!({"insert": {
                "name": format!("pod-{i}.ns"),
                "addresses": format!("0a:58:64:00:{:02x}:{:02x} 10.100.{}.{}", i >> 8 & 255, i & 255, i >> 8, i & 255),
                "external_ids": ["map", [["ls", "ls0"], ["pod", format!("ns/pod-{i}")], ["vendor", "kube-ovn"]]],
            }}),
        );
    }
    json!({ "Logical_Switch_Port": rows })
}

fn framing(c: &mut Criterion) {
    let u = updates();
    let msg = serde_json::to_vec(&json!({
        "id": null, "method": "update3",
        "params": ["m1", "00000000-0000-0000-0000-000000000000", u],
    }))
    .expect("encode");
    let mut g = c.benchmark_group("ovsdb_framing");
    g.sample_size(10)
        .throughput(Throughput::Bytes(msg.len() as u64));
    g.bench_function("decode_update_5k_rows", |b| {
        b.iter(|| {
            let mut d = FrameDecoder::new();
            d.feed(&msg);
            black_box(d.next_message().expect("decode").expect("one message"))
        })
    });
    g.finish();
}

fn datums(c: &mut Criterion) {
    let s = schema();
    let lsp = s.table("Logical_Switch_Port").expect("table");
    let ext = &lsp.column("external_ids").expect("column").ty;
    let j = json!([
        "map",
        [["ls", "ls0"], ["pod", "ns/pod-1"], ["vendor", "kube-ovn"]]
    ]);
    let ports = &s
        .table("Logical_Switch")
        .expect("table")
        .column("ports")
        .expect("column")
        .ty;
    let set = json!([
        "set",
        (0..N).map(|i| json!(["uuid", uuid(i)])).collect::<Vec<_>>()
    ]);
    let mut g = c.benchmark_group("ovsdb_datum");
    g.bench_function("map_3_keys", |b| {
        b.iter(|| black_box(Datum::from_json_typed(black_box(&j), ext).expect("datum")))
    });
    g.throughput(Throughput::Elements(N as u64));
    g.sample_size(20);
    g.bench_function("uuid_set_5k", |b| {
        b.iter(|| black_box(Datum::from_json_typed(black_box(&set), ports).expect("datum")))
    });
    g.finish();
}

fn updates_and_cache(c: &mut Criterion) {
    let s = schema();
    let u = updates();
    let builder = CacheBuilder::new("OVN_Northbound")
        .table("Logical_Switch_Port")
        .index("Logical_Switch_Port", "name")
        .map_key_index("Logical_Switch_Port", "external_ids", "pod");
    let mut g = c.benchmark_group("ovsdb_cache");
    g.sample_size(10).throughput(Throughput::Elements(N as u64));
    g.bench_function("parse_updates_5k_rows", |b| {
        b.iter(|| black_box(parse_table_updates(&u, true, Some(&s)).expect("updates")))
    });
    // From the JSON text, as received: through a Value tree (the former path) and directly.
    let text = u.to_string();
    g.bench_function("decode_text_via_value_5k_rows", |b| {
        b.iter(|| {
            let v: Json = serde_json::from_str(black_box(&text)).expect("json");
            black_box(parse_table_updates(&v, true, Some(&s)).expect("updates"))
        })
    });
    g.bench_function("decode_text_direct_5k_rows", |b| {
        b.iter(|| {
            black_box(parse_table_updates_str(black_box(&text), true, Some(&s)).expect("updates"))
        })
    });
    g.bench_function("decode_direct_and_apply_5k_rows", |b| {
        b.iter_batched(
            || builder.build(&s).expect("cache"),
            |cache| {
                cache.apply(
                    parse_table_updates_str(&text, true, Some(&s)).expect("updates"),
                    None,
                );
                cache
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("apply_5k_inserts", |b| {
        b.iter_batched(
            || {
                (
                    builder.build(&s).expect("cache"),
                    parse_table_updates(&u, true, Some(&s)).expect("updates"),
                )
            },
            |(cache, tu)| {
                cache.apply(tu, None);
                cache
            },
            BatchSize::LargeInput,
        )
    });
    let cache = builder.build(&s).expect("cache");
    cache.apply(
        parse_table_updates(&u, true, Some(&s)).expect("updates"),
        None,
    );
    let names: Vec<String> = (0..N).map(|i| format!("pod-{i}.ns")).collect();
    let pods: Vec<String> = (0..N).map(|i| format!("ns/pod-{i}")).collect();
    g.sample_size(20);
    g.bench_function("lookup_name_5k", |b| {
        b.iter(|| {
            for n in &names {
                black_box(cache.lookup("Logical_Switch_Port", "name", n).expect("row"));
            }
        })
    });
    g.bench_function("lookup_external_id_5k", |b| {
        b.iter(|| {
            for p in &pods {
                black_box(
                    cache
                        .lookup_map("Logical_Switch_Port", "external_ids", "pod", p)
                        .expect("row"),
                );
            }
        })
    });
    g.finish();
}

criterion_group!(benches, framing, datums, updates_and_cache);
criterion_main!(benches);
