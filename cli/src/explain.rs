//! `sluice explain JOB`: the plan a job file (YAML or SQL) becomes, without running it:
//! its tasks (chains of operators) with their parallelism, how records move between
//! them, what keyed state each operator keeps and the schema it emits.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;
use sluice_common::pb;
use sluice_compute::plan::PhysicalPlan;

use crate::Failure;
use crate::run::load_job;

/// Arguments of `sluice explain`.
#[derive(Args)]
pub struct ExplainArgs {
    /// The job file: YAML, or SQL when its name ends in `.sql`.
    job: PathBuf,
}

/// Prints the plan of the job file.
pub fn run(args: ExplainArgs) -> Result<(), Failure> {
    let graph = load_job(&args.job)?;
    let plan = crate::runtime()?
        .block_on(sluice_compute::plan::plan(
            graph,
            sluice_connectors::Builtin::shared(),
        ))
        .map_err(Failure::from_compute)?;
    for line in explain(&plan).lines() {
        sluice_common::output::line(format_args!("{line}"));
    }
    Ok(())
}

/// The plan as text, one block per task.
pub fn explain(plan: &PhysicalPlan) -> String {
    let g = &plan.graph;
    let mut out = String::new();
    let state = g.state.as_ref().map_or("memory", |s| {
        if s.backend == pb::StateBackend::Remote as i32 {
            "remote"
        } else {
            "memory"
        }
    });
    let checkpoints = match &g.checkpoint {
        Some(c) if c.interval_ms > 0 => {
            let mode = if c.mode == pb::CheckpointMode::Unaligned as i32 {
                "unaligned"
            } else {
                "aligned"
            };
            format!("every {} ms, {mode}", c.interval_ms)
        }
        _ => "none".to_owned(),
    };
    let _ = writeln!(
        out,
        "job {}: {} key groups, keyed state in {state}, checkpoints {checkpoints}",
        g.name, plan.max_parallelism
    );
    for chain in &plan.chains {
        let plural = if chain.parallelism == 1 { "" } else { "s" };
        let _ = writeln!(
            out,
            "task {} ({} subtask{plural})",
            chain.id, chain.parallelism
        );
        let two = chain.input.len() > 1;
        for (input, &(from, _)) in chain.input.iter().enumerate() {
            for edge in plan.chains[from]
                .outputs
                .iter()
                .filter(|e| e.to_chain == chain.id && e.to_input == input)
            {
                let which = match (two, input) {
                    (false, _) => "",
                    (true, 0) => " (left)",
                    (true, _) => " (right)",
                };
                let _ = writeln!(
                    out,
                    "  input{which}: {} from task {from}",
                    partitioning(edge)
                );
            }
        }
        let nodes = chain.source.iter().chain(&chain.operators);
        for &id in nodes {
            let node = plan.node(id);
            let _ = writeln!(out, "  {}: {}", node.name, describe(node));
            let updating_input = match node.kind {
                Some(pb::node::Kind::Aggregate(_) | pb::node::Kind::TopN(_)) => {
                    Some(plan.input_schema(id))
                }
                Some(pb::node::Kind::Join(_)) => [plan.input_schema(id)]
                    .into_iter()
                    .chain(plan.right_input_schema(id).ok())
                    .find(|input| sluice_compute::changelog::is_changelog(input)),
                _ => None,
            }
            .filter(|input| sluice_compute::changelog::is_changelog(input));
            if let Some(state) = keyed_state(node, updating_input.as_ref()) {
                let _ = writeln!(out, "    keyed state: {state}");
            }
            let (verb, schema) = match node.kind {
                Some(pb::node::Kind::Sink(_)) => ("writes", plan.input_schema(id)),
                _ => ("emits", plan.output_schema(id)),
            };
            let columns: Vec<String> = schema
                .fields()
                .iter()
                .map(|f| format!("{} {}", f.name(), f.data_type()))
                .collect();
            let updating = if sluice_compute::changelog::is_changelog(&schema) {
                " (updating: op is +I, -U, +U or -D)"
            } else {
                ""
            };
            let _ = writeln!(out, "    {verb}{updating}: {}", columns.join(", "));
        }
        for edge in &chain.outputs {
            let side = if edge.tag.is_empty() {
                String::new()
            } else {
                format!(" (side output `{}`)", edge.tag)
            };
            let _ = writeln!(
                out,
                "  output: {} to task {}{side}",
                partitioning(edge),
                edge.to_chain
            );
        }
    }
    out
}

fn partitioning(edge: &sluice_compute::plan::ChainEdge) -> String {
    match edge.partitioning {
        pb::Partitioning::Hash if edge.key_columns.is_empty() => {
            "all to one subtask (no key)".to_owned()
        }
        pb::Partitioning::Hash => format!("hash on [{}]", edge.key_columns.join(", ")),
        pb::Partitioning::Forward => "forward".to_owned(),
        pb::Partitioning::Rebalance => "rebalance".to_owned(),
        pb::Partitioning::Broadcast => "broadcast".to_owned(),
    }
}

/// A join's description; `lookup`: the table a lookup join reads.
fn join_text(j: &pb::JoinSpec, lookup: Option<&str>) -> String {
    let alias = |a: &str, d: &'static str| {
        if a.is_empty() {
            d.to_owned()
        } else {
            a.to_owned()
        }
    };
    let (l, r) = (alias(&j.left_alias, "l"), alias(&j.right_alias, "r"));
    let on: Vec<String> = j
        .left_keys
        .iter()
        .zip(&j.right_keys)
        .map(|(a, b)| match j.null_safe {
            true => format!("{l}.{a} IS NOT DISTINCT FROM {r}.{b}"),
            false => format!("{l}.{a} = {r}.{b}"),
        })
        .collect();
    let condition = j
        .condition
        .as_ref()
        .map_or(String::new(), |c| format!(" AND {}", c.sql));
    let exprs: Vec<&str> = j.exprs.iter().map(|e| e.sql.as_str()).collect();
    let select = if exprs.is_empty()
        && matches!(
            j.r#type(),
            pb::JoinType::Semi | pb::JoinType::Anti | pb::JoinType::NotIn
        ) {
        format!("{l}.*")
    } else if exprs.is_empty() {
        "*".to_owned()
    } else {
        exprs.join(", ")
    };
    let kind = match j.r#type() {
        pb::JoinType::Inner => "INNER JOIN",
        pb::JoinType::Left => "LEFT OUTER JOIN",
        pb::JoinType::Right => "RIGHT OUTER JOIN",
        pb::JoinType::Full => "FULL OUTER JOIN",
        pb::JoinType::Semi => "LEFT SEMI JOIN",
        pb::JoinType::Anti => "LEFT ANTI JOIN",
        pb::JoinType::NotIn => "LEFT ANTI JOIN (NOT IN)",
    };
    let kind = match lookup {
        Some(table) => format!("{kind} {table} AS {r} FOR SYSTEM_TIME AS OF processing time"),
        None => kind.to_owned(),
    };
    format!("{kind} ON {}{condition}: SELECT {select}", on.join(" AND "))
}

/// What a source reads.
fn source_text(s: &pb::SourceSpec) -> String {
    match &s.kind {
        Some(pb::source_spec::Kind::Nexmark(n)) => {
            let stream = pb::NexmarkStream::try_from(n.stream)
                .map_or("?", |s| s.as_str_name())
                .trim_start_matches("NEXMARK_STREAM_")
                .to_ascii_lowercase();
            format!("nexmark {stream}, {} events", n.events)
        }
        Some(pb::source_spec::Kind::File(f)) => format!("files {}", f.path),
        Some(pb::source_spec::Kind::Kafka(k)) => {
            format!("kafka topics {}", k.topics.join(", "))
        }
        None => "source".to_owned(),
    }
}

fn describe(node: &pb::Node) -> String {
    use pb::node::Kind;
    match &node.kind {
        Some(Kind::Source(s)) => source_text(s),
        Some(Kind::Filter(f)) => format!(
            "WHERE {}",
            f.predicate.as_ref().map_or("", |e| e.sql.as_str())
        ),
        Some(Kind::Select(s)) => {
            let exprs: Vec<&str> = s.exprs.iter().map(|e| e.sql.as_str()).collect();
            format!("SELECT {}", exprs.join(", "))
        }
        Some(Kind::Window(w)) => {
            let kind = match &w.kind {
                Some(pb::window_spec::Kind::Tumbling(t)) => format!("tumbling {} ms", t.size_ms),
                Some(pb::window_spec::Kind::Sliding(s)) => {
                    format!("sliding {} ms every {} ms", s.size_ms, s.slide_ms)
                }
                Some(pb::window_spec::Kind::Session(s)) => format!("session gap {} ms", s.gap_ms),
                Some(pb::window_spec::Kind::Cumulate(c)) => {
                    format!("cumulate {} ms every {} ms", c.size_ms, c.step_ms)
                }
                Some(pb::window_spec::Kind::Cascade(_)) => {
                    format!(
                        "cascade over the upstream windows ending at {}",
                        w.time_column
                    )
                }
                None => "window".to_owned(),
            };
            let time = match w.time() {
                pb::TimeCharacteristic::TimeProcessing => " in processing time",
                _ => "",
            };
            let aggs: Vec<&str> = w.aggregates.iter().map(|e| e.sql.as_str()).collect();
            format!("{kind}{time}: {}", aggs.join(", "))
        }
        Some(Kind::Dedup(d)) => format!("first row per [{}]", d.key_columns.join(", ")),
        Some(Kind::TopN(t)) => {
            let order: Vec<String> = t
                .order_by
                .iter()
                .map(|k| {
                    let dir = if k.descending { "DESC" } else { "ASC" };
                    let nulls = if k.nulls_first { "FIRST" } else { "LAST" };
                    format!("{} {dir} NULLS {nulls}", k.column)
                })
                .collect();
            let rank = if t.rank_column.is_empty() {
                String::new()
            } else {
                format!(", rank as {}", t.rank_column)
            };
            format!(
                "top {} per [{}] by {}{rank}",
                t.limit,
                t.partition_columns.join(", "),
                order.join(", ")
            )
        }
        Some(Kind::Over(o)) => {
            let aggs: Vec<&str> = o.aggregates.iter().map(|e| e.sql.as_str()).collect();
            format!(
                "OVER (PARTITION BY [{}] ORDER BY {} {}): {}",
                o.partition_columns.join(", "),
                o.time_column,
                over_frame_text(o),
                aggs.join(", ")
            )
        }
        Some(Kind::Join(j)) => join_text(j, None),
        Some(Kind::Union(_)) => {
            "UNION ALL of both inputs, under the left's column names".to_owned()
        }
        Some(Kind::LookupJoin(j)) => {
            let table = j.table.as_ref().map_or("?".to_owned(), source_text);
            join_text(
                &sluice_compute::operator::lookup_join::LookupJoinOperator::join_spec(j),
                Some(&table),
            )
        }
        Some(Kind::Aggregate(a)) => {
            let aggs: Vec<&str> = a.aggregates.iter().map(|e| e.sql.as_str()).collect();
            format!(
                "GROUP BY [{}] (unbounded): {}",
                a.key_columns.join(", "),
                aggs.join(", ")
            )
        }
        Some(Kind::Sink(s)) => match &s.kind {
            Some(pb::sink_spec::Kind::Stdout(_)) => "stdout".to_owned(),
            Some(pb::sink_spec::Kind::Blackhole(_)) => "blackhole".to_owned(),
            Some(pb::sink_spec::Kind::File(f)) if !f.partition_by.is_empty() => format!(
                "files {}, a directory per [{}]",
                f.path,
                f.partition_by.join(", ")
            ),
            Some(pb::sink_spec::Kind::File(f)) => format!("files {}", f.path),
            Some(pb::sink_spec::Kind::Kafka(k)) => format!("kafka topic {}", k.topic),
            None => "sink".to_owned(),
        },
        None => String::new(),
    }
}

/// An OVER aggregate's frame as SQL writes it.
fn over_frame_text(o: &pb::OverSpec) -> String {
    let (unit, preceding) = match o.unit() {
        pb::OverFrameUnit::Rows => ("ROWS", o.preceding.to_string()),
        pb::OverFrameUnit::Range => ("RANGE", format!("INTERVAL '{}' MILLISECOND", o.preceding)),
    };
    match o.unbounded {
        true => format!("{unit} BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"),
        false => format!("{unit} BETWEEN {preceding} PRECEDING AND CURRENT ROW"),
    }
}

/// What an operator keeps per key, if anything (`updating_input`: the changelog an
/// aggregate, a Top-N or a join reads).
fn keyed_state(
    node: &pb::Node,
    updating_input: Option<&arrow::datatypes::SchemaRef>,
) -> Option<String> {
    match &node.kind {
        Some(pb::node::Kind::Window(w)) if w.key_columns.is_empty() => {
            Some("one accumulator per open window (not keyed: one subtask)".to_owned())
        }
        Some(pb::node::Kind::Window(w)) => Some(format!(
            "an accumulator per [{}] and open window",
            w.key_columns.join(", ")
        )),
        Some(pb::node::Kind::Dedup(d)) => {
            Some(format!("the keys [{}] seen", d.key_columns.join(", ")))
        }
        Some(pb::node::Kind::Over(o)) => {
            let per = match o.partition_columns.is_empty() {
                true => " (not keyed: one subtask)".to_owned(),
                false => format!(" per [{}]", o.partition_columns.join(", ")),
            };
            let frame = match (o.unit(), o.unbounded) {
                (_, true) => "a running total".to_owned(),
                (pb::OverFrameUnit::Rows, false) => {
                    format!("the last {} rows' accumulators", o.preceding)
                }
                (pb::OverFrameUnit::Range, false) => {
                    format!("an accumulator per time of the last {} ms", o.preceding)
                }
            };
            Some(format!("rows waiting for the watermark, and {frame}{per}"))
        }
        Some(pb::node::Kind::TopN(t)) => {
            let per = match t.partition_columns.is_empty() {
                true => " (not keyed: one subtask)".to_owned(),
                false => format!(" per [{}]", t.partition_columns.join(", ")),
            };
            // Over a changelog a retracted top row is replaced from the rows below it.
            Some(match updating_input {
                Some(_) => format!(
                    "every live row and the top {}{per}; a retracted row's place goes to \
                     the next",
                    t.limit
                ),
                None => format!("the top {} rows{per}", t.limit),
            })
        }
        Some(pb::node::Kind::Join(j)) => {
            let ttl = match (&j.interval, j.ttl_ms) {
                (Some(i), _) => {
                    let [l, r] = [&j.left_alias, &j.right_alias]
                        .map(|a| if a.is_empty() { "" } else { a.as_str() });
                    let dot = |a: &str| {
                        if a.is_empty() {
                            String::new()
                        } else {
                            format!("{a}.")
                        }
                    };
                    let plus = |ms: i64| match ms {
                        0 => String::new(),
                        ms if ms > 0 => format!(" + {ms} ms"),
                        ms => format!(" - {} ms", ms.unsigned_abs()),
                    };
                    let padded = match j.r#type() {
                        pb::JoinType::Inner => "",
                        _ => ", then padded with nulls if no pair of it passed ON",
                    };
                    format!(
                        "an interval join: each kept until the watermark passes the last \
                         time it can match, a left row's {}{}{}, a right row's {}{}{}{padded}",
                        dot(l),
                        i.left_time,
                        plus(i.lower_ms.saturating_neg()),
                        dot(r),
                        i.right_time,
                        plus(i.upper_ms)
                    )
                }
                (None, 0) => match (j.r#type(), &j.condition, updating_input) {
                    (pb::JoinType::Inner, _, _) | (_, None, None) => "kept forever".to_owned(),
                    (_, _, Some(_)) => "kept forever; a preserved row keeps a count of the \
                                        rows it passes ON with, and is written padded with \
                                        nulls while it has none"
                        .to_owned(),
                    _ => "kept forever; a preserved row is written padded with nulls until \
                          a pair of it passes ON"
                        .to_owned(),
                },
                (None, ms) => format!("each kept {ms} ms after it arrived"),
            };
            let rows = match j.r#type() {
                pb::JoinType::Semi => "the left rows still without a match and every right row",
                _ => "every row of both sides",
            };
            let ttl = match j.r#type() {
                pb::JoinType::Anti | pb::JoinType::NotIn => {
                    format!("{ttl}; a left row is written while it has no match")
                }
                _ => ttl,
            };
            Some(format!(
                "{rows} per key [{}] / [{}], {ttl}",
                j.left_keys.join(", "),
                j.right_keys.join(", ")
            ))
        }
        Some(pb::node::Kind::LookupJoin(_)) => Some(
            "none; every subtask holds the whole table in memory, read when it starts".to_owned(),
        ),
        Some(pb::node::Kind::Aggregate(a)) => {
            let mut text = match a.key_columns.is_empty() {
                true => "one accumulator (not keyed: one subtask)".to_owned(),
                false => format!(
                    "an accumulator per [{}], kept forever",
                    a.key_columns.join(", ")
                ),
            };
            if let Some(input) = updating_input {
                use sluice_compute::expr::aggregate::{AggFunc, AggregateCall};
                let compiler = sluice_compute::expr::ExprCompiler::new();
                let extremes = a.aggregates.iter().any(|e| {
                    AggregateCall::compile(&compiler, &e.sql, input)
                        .is_ok_and(|c| matches!(c.func, AggFunc::Min | AggFunc::Max))
                });
                text.push_str("; retractions taken back");
                if extremes {
                    text.push_str(", with every MIN/MAX value counted per key");
                }
            }
            Some(text)
        }
        _ => None,
    }
}
