//! From SQL statements to the tree a job file parses into.
//!
//! Tables become the `source:` and `sink:` sections (a `'connector'` option names the
//! connector, the other options are its keys; `'a.b'` is key `b` of section `a`), `SET`
//! statements the job's settings, and the query the `pipeline:` list: `WHERE` a filter,
//! a projection a select, a window table function with its `GROUP BY` a keyed window
//! (then a select when the `SELECT` list orders or renames its columns).

use std::collections::HashMap;

use sqlparser::ast::{
    BinaryOperator, CreateTable, CreateTableOptions, DateTimeField, DuplicateTreatment, Expr,
    FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, Ident, JoinConstraint,
    JoinOperator, ObjectName, ObjectNamePart, Query, SelectItem, SetExpr, Spanned, SqlOption,
    Statement, TableFactor, TableObject, TableWithJoins, Value as SqlValue, WindowSpec,
};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::{Parser, ParserError};

use super::SETTINGS;
use super::text::{self, AsOfClause, Clauses, WatermarkClause, pos};
use crate::job_spec::{Node, Pos, Value};

/// A mistake at a position in the SQL text; the caller adds the file name.
pub(super) use crate::job_spec::PosError as SqlError;

pub(super) type Result<T> = std::result::Result<T, SqlError>;

/// Connectors a table read by the query may name.
const SOURCE_CONNECTORS: &[&str] = &["nexmark", "file", "kafka"];
/// Connectors an `INSERT INTO` table may name (`print` is Flink's name for stdout).
const SINK_CONNECTORS: &[&str] = &["print", "stdout", "blackhole", "file", "kafka"];

struct Table {
    at: Pos,
    connector: (String, Pos),
    /// Options other than `connector`, in the order written.
    options: Vec<(String, Node)>,
    watermark: Option<WatermarkClause>,
    /// The name of its processing-time column (`p_time AS PROCTIME()`), if it has one.
    proctime: Option<String>,
    /// `PARTITIONED BY (dt, hm)`: the columns naming a written file table's directories.
    partition_by: Option<(Vec<Node>, Pos)>,
}

/// What the statements of a SQL text define, in the order written.
struct Statements<'a> {
    settings: Vec<Setting>,
    tables: HashMap<String, Table>,
    views: HashMap<String, &'a Query>,
    /// Tables and views by name, as they were created.
    order: Vec<String>,
    inserts: Vec<(&'a sqlparser::ast::Insert, Pos)>,
}

/// Walks `statements`: settings, tables and views, and the INSERTs; anything else is
/// refused at its position.
fn collect<'a>(statements: &'a [Statement], clauses: &mut Clauses) -> Result<Statements<'a>> {
    let mut out = Statements {
        settings: Vec::new(),
        tables: HashMap::new(),
        views: HashMap::new(),
        order: Vec::new(),
        inserts: Vec::new(),
    };
    for statement in statements {
        let at = pos(statement.span().start);
        match statement {
            Statement::Set(set) => out.settings.push(setting(set, at)?),
            Statement::CreateTable(ct) => {
                let (name, table) = create_table(ct, clauses)?;
                if out.tables.contains_key(&name) || out.views.contains_key(&name) {
                    return Err(SqlError::new(
                        table.at,
                        format!("table `{name}` is created twice"),
                    ));
                }
                out.order.push(name.clone());
                out.tables.insert(name, table);
            }
            Statement::CreateView(v) => {
                let (name, at) = object_name(&v.name)?;
                if v.materialized || !v.columns.is_empty() {
                    return Err(unsupported(at, "materialized views and view column lists"));
                }
                if out.tables.contains_key(&name) || out.views.contains_key(&name) {
                    return Err(SqlError::new(at, format!("`{name}` is created twice")));
                }
                out.order.push(name.clone());
                out.views.insert(name, &v.query);
            }
            Statement::Insert(ins) => {
                let at = pos(ins.insert_token.0.span.start);
                out.inserts.push((ins, at));
            }
            Statement::Query(_) => {
                return Err(SqlError::new(
                    at,
                    "a bare SELECT has no sink: write `INSERT INTO table SELECT ...` into a \
                     table created WITH ('connector' = 'print') to see its rows"
                        .to_owned(),
                ));
            }
            other => {
                let what = other.to_string();
                let what = what
                    .split_whitespace()
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" ");
                return Err(unsupported(at, &format!("the statement `{what} ...`")));
            }
        }
    }
    Ok(out)
}

/// A WATERMARK or PROCTIME() clause no CREATE TABLE took is a mistake.
fn no_stray_clause(clauses: &Clauses) -> Result<()> {
    if let Some(w) = clauses.watermarks.first() {
        return Err(SqlError::new(
            w.at,
            "WATERMARK is only accepted in a CREATE TABLE's column list".to_owned(),
        ));
    }
    if let Some(p) = clauses.proctimes.first() {
        return Err(SqlError::new(
            p.at,
            "`column AS PROCTIME()` is only accepted in a CREATE TABLE's column list; \
             write it there and use the column"
                .to_owned(),
        ));
    }
    Ok(())
}

/// A table or view a SQL text creates, as a shell lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defined {
    /// Its name.
    pub name: String,
    /// The table's connector; `None` for a view.
    pub connector: Option<String>,
}

/// The tables and views `text` creates (settings, tables and views only: an INSERT is
/// refused), checked as a job's would be up to the query.
pub(super) fn defined(text: &str) -> Result<Vec<Defined>> {
    let prepared = text::prepare(text)?;
    let statements = Parser::parse_sql(&GenericDialect {}, &prepared.sql).map_err(parser_error)?;
    let mut clauses = prepared.clauses;
    let found = collect(&statements, &mut clauses)?;
    if let Some(&(_, at)) = found.inserts.first() {
        return Err(SqlError::new(
            at,
            "only SET, CREATE TABLE and CREATE VIEW define; an INSERT runs a job".to_owned(),
        ));
    }
    no_stray_clause(&clauses)?;
    Ok(found
        .order
        .into_iter()
        .map(|name| Defined {
            connector: found.tables.get(&name).map(|t| t.connector.0.clone()),
            name,
        })
        .collect())
}

/// One INSERT of a job as the tree of a job file with its source, pipeline and sink.
pub(super) struct InsertTree {
    /// The job file tree.
    pub tree: Node,
    /// The table it writes.
    pub sink: String,
    /// Where the INSERT starts.
    pub at: Pos,
}

/// The trees of the job `text` describes, one per INSERT in the order written (each
/// with the job's settings); `file` gives the default job name.
pub(super) fn job_trees(file: &str, text: &str) -> Result<Vec<InsertTree>> {
    let prepared = text::prepare(text)?;
    let statements = Parser::parse_sql(&GenericDialect {}, &prepared.sql).map_err(parser_error)?;
    let mut clauses = prepared.clauses;
    let Statements {
        settings,
        tables,
        views,
        inserts,
        ..
    } = collect(&statements, &mut clauses)?;
    no_stray_clause(&clauses)?;
    if inserts.is_empty() {
        return Err(SqlError::new(
            Pos::START,
            "the job has no `INSERT INTO sink SELECT ...`; nothing would run".to_owned(),
        ));
    }
    let join_ttl = settings
        .iter()
        .find(|(key, _, _)| key == "table.exec.state.ttl")
        .map(|(_, _, value)| value.clone());
    let catalog = Catalog {
        tables,
        views,
        ctes: Default::default(),
        join_ttl,
        as_of: std::mem::take(&mut clauses.as_of),
    };
    inserts
        .into_iter()
        .map(|(ins, at)| insert_tree(file, &settings, &catalog, ins, at))
        .collect()
}

/// The tree of one INSERT.
fn insert_tree(
    file: &str,
    settings: &[Setting],
    catalog: &Catalog,
    ins: &sqlparser::ast::Insert,
    insert_at: Pos,
) -> Result<InsertTree> {
    let TableObject::TableName(sink_name) = &ins.table else {
        return Err(unsupported(insert_at, "INSERT INTO a table function"));
    };
    if !ins.columns.is_empty() {
        return Err(unsupported(insert_at, "an INSERT column list"));
    }
    let (sink_name, sink_at) = object_name(sink_name)?;
    let Some(query) = &ins.source else {
        return Err(SqlError::new(
            insert_at,
            "INSERT needs a SELECT query".to_owned(),
        ));
    };
    let sink = catalog
        .tables
        .get(&sink_name)
        .ok_or_else(|| catalog.unknown(&sink_name, sink_at))?;
    let plan = lower_query(query, catalog, insert_at, 0)?;
    if let Some(rank) = &plan.rank {
        return Err(unbounded_rank(rank));
    }
    let tables = &catalog.tables;
    let source = &tables[&plan.source];
    let default_name = std::path::Path::new(file).file_stem().map_or_else(
        || "sql-job".to_owned(),
        |s| s.to_string_lossy().into_owned(),
    );
    let tree = job(
        default_name,
        settings.to_vec(),
        (&plan.source, source),
        (&sink_name, sink),
        plan.pipeline,
        insert_at,
    )?;
    Ok(InsertTree {
        tree,
        sink: sink_name,
        at: insert_at,
    })
}

/// Lays out the top level as a job file would.
fn job(
    default_name: String,
    settings: Vec<Setting>,
    (source_name, source): (&str, &Table),
    (sink_name, sink): (&str, &Table),
    pipeline: Vec<Node>,
    at: Pos,
) -> Result<Node> {
    let mut top = Section::default();
    let named = settings.iter().any(|(_, path, _)| *path == ["name"]);
    for (_, path, value) in settings {
        if !path.is_empty() {
            top.put(path, value)?;
        }
    }
    if !named {
        top.put(&["name"], scalar(default_name, Pos::START))?;
    }

    let (connector, connector_at) = &source.connector;
    if !SOURCE_CONNECTORS.contains(&connector.as_str()) {
        return Err(SqlError::new(
            *connector_at,
            format!(
                "table `{source_name}` is read, but connector `{connector}` only writes; a \
                 table read by a query needs one of {}",
                SOURCE_CONNECTORS.join(", ")
            ),
        ));
    }
    let (src, watermark) = source_nodes(source)?;
    top.put(&["source"], src)?;
    if let Some(w) = watermark {
        top.put(&["watermark"], w)?;
    }
    top.put(&["pipeline"], seq(pipeline, at))?;

    let (connector, connector_at) = &sink.connector;
    if !SINK_CONNECTORS.contains(&connector.as_str()) {
        return Err(SqlError::new(
            *connector_at,
            format!(
                "table `{sink_name}` is written, but connector `{connector}` only reads; an \
                 INSERT INTO table needs one of {}",
                SINK_CONNECTORS.join(", ")
            ),
        ));
    }
    let connector = if connector == "print" {
        "stdout"
    } else {
        connector.as_str()
    };
    let mut snk = Section::default();
    snk.put(&[connector], map(Vec::new(), *connector_at))?;
    if let Some((columns, at)) = &sink.partition_by {
        if connector != "file" {
            return Err(SqlError::new(
                *at,
                format!(
                    "table `{sink_name}` is PARTITIONED BY, which only a 'file' table \
                     writes (a directory per partition)"
                ),
            ));
        }
        snk.put(&["file", "partition_by"], seq(columns.clone(), *at))?;
    }
    for (key, value) in &sink.options {
        match key.as_str() {
            "parallelism" => snk.put(&["parallelism"], value.clone())?,
            _ => snk.put(&option_path(connector, key), value.clone())?,
        }
    }
    top.put(&["sink"], snk.into_node(sink.at))?;
    Ok(top.into_node(Pos::START))
}

/// A read table's `source:` and `watermark:` sections, as a job file writes them.
fn source_nodes(source: &Table) -> Result<(Node, Option<Node>)> {
    if let Some((_, at)) = &source.partition_by {
        return Err(SqlError::new(
            *at,
            "a PARTITIONED BY table is written here, not read: reading partitioned \
             directories is not supported yet"
                .to_owned(),
        ));
    }
    let (connector, connector_at) = &source.connector;
    let mut src = Section::default();
    src.put(&[connector.as_str()], map(Vec::new(), *connector_at))?;
    for (key, value) in &source.options {
        match key.as_str() {
            "batch_size" => src.put(&["batch_size"], value.clone())?,
            _ => src.put(&option_path(connector, key), value.clone())?,
        }
    }
    let watermark = source.watermark.as_ref().map(watermark).transpose()?;
    Ok((src.into_node(source.at), watermark))
}

/// Where option `key` of `connector` goes: `'a.b'` is key `b` of the connector's `a`.
fn option_path<'a>(connector: &'a str, key: &'a str) -> Vec<&'a str> {
    match key.split_once('.') {
        Some((section, rest)) => vec![connector, section, rest],
        None => vec![connector, key],
    }
}

/// `WATERMARK FOR col AS col [- INTERVAL 'n' UNIT]` as the job file's `watermark:`.
fn watermark(w: &WatermarkClause) -> Result<Node> {
    let expected = || {
        SqlError::new(
            w.expr_at,
            format!(
                "expected `{c}` or `{c} - INTERVAL 'n' SECOND` as the watermark of `{c}` \
                 (bounded out-of-orderness); found `{}`",
                w.expr,
                c = w.column
            ),
        )
    };
    let expr = parse_expr(&w.expr).map_err(|_| expected())?;
    let delay = match &expr {
        Expr::Identifier(id) if id.value == w.column => scalar("0ms", w.expr_at),
        Expr::BinaryOp {
            left,
            op: sqlparser::ast::BinaryOperator::Minus,
            right,
        } if matches!(left.as_ref(), Expr::Identifier(id) if id.value == w.column) => {
            // Positions inside the re-parsed clause are relative to it: use its own.
            let mut delay =
                duration(right, w.expr_at).map_err(|e| SqlError::new(w.expr_at, e.message))?;
            delay.pos = w.expr_at;
            delay
        }
        _ => return Err(expected()),
    };
    let mut s = Section::default();
    s.put(&["column"], scalar(w.column.clone(), w.at))?;
    s.put(&["max_out_of_orderness"], delay)?;
    Ok(s.into_node(w.at))
}

/// An `INTERVAL` as a job file's duration (`INTERVAL '10' SECOND` is `10s`).
fn duration(e: &Expr, fallback: Pos) -> Result<Node> {
    let at = located(e, fallback);
    let expected = || {
        SqlError::new(
            at,
            format!("expected an interval such as `INTERVAL '10' SECOND`, found `{e}`"),
        )
    };
    let Expr::Interval(i) = e else {
        return Err(expected());
    };
    let value = match i.value.as_ref() {
        Expr::Value(v) => match &v.value {
            SqlValue::SingleQuotedString(s) | SqlValue::Number(s, _) => s.trim().to_owned(),
            _ => return Err(expected()),
        },
        _ => return Err(expected()),
    };
    if i.last_field.is_some() {
        return Err(unsupported(at, "an interval range such as `DAY TO SECOND`"));
    }
    let unit = match &i.leading_field {
        None => {
            // `INTERVAL '10 seconds'`, or a job file's `INTERVAL '10s'`.
            return Ok(scalar(spelled_duration(&value).unwrap_or(value), at));
        }
        Some(DateTimeField::Millisecond | DateTimeField::Milliseconds) => "ms",
        Some(DateTimeField::Second | DateTimeField::Seconds) => "s",
        Some(DateTimeField::Minute | DateTimeField::Minutes) => "m",
        Some(DateTimeField::Hour | DateTimeField::Hours) => "h",
        Some(DateTimeField::Day | DateTimeField::Days) => "d",
        Some(other) => {
            return Err(SqlError::new(
                at,
                format!(
                    "an interval in {other} has no fixed length; use MILLISECOND, SECOND, \
                     MINUTE, HOUR or DAY"
                ),
            ));
        }
    };
    Ok(scalar(format!("{value}{unit}"), at))
}

/// `10 seconds` as `10s`.
fn spelled_duration(value: &str) -> Option<String> {
    let (number, unit) = value.split_once(char::is_whitespace)?;
    let unit = match unit.trim().to_ascii_lowercase().trim_end_matches('s') {
        "millisecond" => "ms",
        "second" => "s",
        "minute" => "m",
        "hour" => "h",
        "day" => "d",
        _ => return None,
    };
    Some(format!("{}{unit}", number.trim()))
}

/// A `SET` statement: its key, where it goes in the tree, and its value.
type Setting = (String, &'static [&'static str], Node);

fn setting(set: &sqlparser::ast::Set, at: Pos) -> Result<Setting> {
    let sqlparser::ast::Set::SingleAssignment {
        variable, values, ..
    } = set
    else {
        return Err(unsupported(
            at,
            "this form of SET; write `SET 'key' = 'value'`",
        ));
    };
    let key = name_text(variable);
    let value = match values.as_slice() {
        [v] => option_value(v, at)?,
        _ => {
            return Err(SqlError::new(at, format!("SET '{key}' takes one value")));
        }
    };
    let Some((_, path, _)) = SETTINGS.iter().find(|(k, _, _)| *k == key) else {
        let known: Vec<String> = SETTINGS
            .iter()
            .map(|(k, _, what)| format!("'{k}' ({what})"))
            .collect();
        return Err(SqlError::new(
            value.pos,
            format!(
                "unknown setting '{key}'; expected one of {}",
                known.join(", ")
            ),
        ));
    };
    Ok((key, path, value))
}

fn create_table(ct: &CreateTable, clauses: &mut Clauses) -> Result<(String, Table)> {
    let (name, at) = object_name(&ct.name)?;
    let end = pos(ct.span().end);
    if let Some(c) = ct.columns.first() {
        return Err(SqlError::new(
            pos(c.name.span.start),
            format!(
                "column definitions are not supported yet: table `{name}` has its \
                 connector's columns (a WATERMARK clause alone may stand in the list)"
            ),
        ));
    }
    if ct.query.is_some() {
        return Err(unsupported(at, "CREATE TABLE ... AS SELECT"));
    }
    if !ct.constraints.is_empty() || ct.primary_key.is_some() {
        return Err(unsupported(at, "table constraints and keys"));
    }
    let options = match &ct.table_options {
        CreateTableOptions::With(options) => options,
        _ => {
            return Err(SqlError::new(
                at,
                format!(
                    "table `{name}` needs its connector: `CREATE TABLE {name} WITH \
                     ('connector' = 'nexmark', ...)`"
                ),
            ));
        }
    };
    let mut connector = None;
    let mut rest: Vec<(String, Node)> = Vec::new();
    for option in options {
        let SqlOption::KeyValue { key, value } = option else {
            return Err(SqlError::new(
                at,
                format!("table `{name}`'s options must be `'key' = 'value'` pairs"),
            ));
        };
        let value = option_value(value, at)?;
        if key.value == "connector" {
            connector = Some((value.text().to_owned(), value.pos));
        } else {
            rest.push((key.value.clone(), value));
        }
    }
    let Some(connector) = connector else {
        return Err(SqlError::new(
            at,
            format!("table `{name}` has no 'connector' option; e.g. 'connector' = 'nexmark'"),
        ));
    };
    let watermarks = &mut clauses.watermarks;
    let mine = watermarks.iter().position(|w| w.at >= at && w.at <= end);
    let watermark = mine.map(|i| watermarks.remove(i));
    if let Some(other) = watermarks.iter().find(|w| w.at >= at && w.at <= end) {
        return Err(SqlError::new(
            other.at,
            format!("table `{name}` has more than one WATERMARK"),
        ));
    }
    let partition_by = match &ct.hive_distribution {
        sqlparser::ast::HiveDistributionStyle::NONE => None,
        sqlparser::ast::HiveDistributionStyle::PARTITIONED { columns } => {
            let at = columns.first().map_or(at, |c| pos(c.name.span.start));
            let names = columns
                .iter()
                .map(|c| scalar(c.name.value.clone(), pos(c.name.span.start)))
                .collect();
            Some((names, at))
        }
        _ => return Err(unsupported(at, "SKEWED BY")),
    };
    let proctimes = &mut clauses.proctimes;
    let mine = proctimes.iter().position(|p| p.at >= at && p.at <= end);
    let proctime = mine.map(|i| proctimes.remove(i).column);
    if let Some(other) = proctimes.iter().find(|p| p.at >= at && p.at <= end) {
        return Err(SqlError::new(
            other.at,
            format!("table `{name}` has more than one PROCTIME() column"),
        ));
    }
    Ok((
        name,
        Table {
            at,
            connector,
            options: rest,
            watermark,
            proctime,
            partition_by,
        },
    ))
}

/// A `WITH` option's or `SET`'s value: a quoted string, a number or a boolean.
fn option_value(e: &Expr, fallback: Pos) -> Result<Node> {
    let at = located(e, fallback);
    match e {
        Expr::Value(v) => match &v.value {
            SqlValue::SingleQuotedString(s) | SqlValue::DoubleQuotedString(s) => {
                Ok(scalar(s.clone(), at))
            }
            SqlValue::Number(n, _) => Ok(scalar(n.clone(), at)),
            SqlValue::Boolean(b) => Ok(scalar(b.to_string(), at)),
            _ => Err(SqlError::new(
                at,
                format!("expected a quoted value, found `{e}`"),
            )),
        },
        _ => Err(SqlError::new(
            at,
            format!("expected a quoted value, found `{e}`"),
        )),
    }
}

/// The query lowered: the table it reads and its operators.
struct Lowered {
    source: String,
    pipeline: Vec<Node>,
    /// A row number the enclosing query must bound (`WHERE rn <= N`) to make a Top-N.
    rank: Option<PendingRank>,
}

/// `ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) AS rn`, not yet bounded.
struct PendingRank {
    column: String,
    partition: Vec<Node>,
    order: Vec<Node>,
    at: Pos,
    /// The columns PARTITION BY and ORDER BY read.
    reads: Vec<String>,
    /// The query's projection, when it would drop a column the ranking reads: it then
    /// runs after the Top-N instead of before it.
    project: Option<Vec<Node>>,
}

/// The tables and views a job created.
struct Catalog<'a> {
    tables: HashMap<String, Table>,
    views: HashMap<String, &'a Query>,
    /// The common table expressions (`WITH name AS (...)`) of the queries being
    /// lowered, innermost last: each shadows a view or table of its name inside its
    /// query.
    ctes: std::cell::RefCell<Vec<(String, std::rc::Rc<Query>)>>,
    /// `table.exec.state.ttl`, given to every join.
    join_ttl: Option<Node>,
    /// The `FOR SYSTEM_TIME AS OF` clauses of the text: each belongs to the table whose
    /// name starts at its `table_at`.
    as_of: Vec<AsOfClause>,
}

impl Catalog<'_> {
    /// The `FOR SYSTEM_TIME AS OF` written after the table `factor` names, if any.
    fn as_of_of(&self, factor: &TableFactor) -> Option<&AsOfClause> {
        let TableFactor::Table { name, .. } = factor else {
            return None;
        };
        let at = name.0.last().map(|p| pos(p.span().start))?;
        self.as_of.iter().find(|c| c.table_at == at)
    }
}

/// Views and subqueries nest no deeper (a view that reads itself ends here).
const MAX_NESTING: usize = 16;

impl Catalog<'_> {
    /// What reading `name` means: a table as it is, or a view's query lowered.
    fn read(&self, name: &str, at: Pos, depth: usize) -> Result<Lowered> {
        if let Some(query) = self.cte(name) {
            return lower_query(&query, self, at, depth + 1);
        }
        if self.tables.contains_key(name) {
            return Ok(Lowered {
                source: name.to_owned(),
                pipeline: Vec::new(),
                rank: None,
            });
        }
        match self.views.get(name) {
            Some(query) => lower_query(query, self, at, depth + 1),
            None => Err(self.unknown(name, at)),
        }
    }

    /// The query of the innermost common table expression named `name`, if any.
    fn cte(&self, name: &str) -> Option<std::rc::Rc<Query>> {
        self.ctes
            .borrow()
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, q)| q.clone())
    }

    fn unknown(&self, name: &str, at: Pos) -> SqlError {
        let ctes = self.ctes.borrow();
        let mut known: Vec<&str> = self
            .tables
            .keys()
            .chain(self.views.keys())
            .chain(ctes.iter().map(|(n, _)| n))
            .map(String::as_str)
            .collect();
        known.sort_unstable();
        known.dedup();
        let known = if known.is_empty() {
            "no table is created yet; CREATE TABLE it first".to_owned()
        } else {
            format!("tables: {}", known.join(", "))
        };
        SqlError::new(at, format!("unknown table `{name}` ({known})"))
    }
}

/// Lowers `query` onto the operators of what it reads (a table, a view, a subquery).
fn lower_query(query: &Query, catalog: &Catalog<'_>, at: Pos, depth: usize) -> Result<Lowered> {
    if depth > MAX_NESTING {
        return Err(SqlError::new(
            at,
            format!(
                "views and subqueries nest deeper than {MAX_NESTING} (does a view read itself?)"
            ),
        ));
    }
    if query.order_by.is_some() || query.limit_clause.is_some() || query.fetch.is_some() {
        return Err(unsupported(at, "ORDER BY, LIMIT and FETCH on a stream"));
    }
    let Some(with) = &query.with else {
        return lower_set_expr(query.body.as_ref(), catalog, at, depth);
    };
    // `WITH name AS (query)`: each name reads its query inside this one, as a view
    // would (a later one may read an earlier one).
    if with.recursive {
        return Err(unsupported(at, "WITH RECURSIVE"));
    }
    let mut scoped = Vec::with_capacity(with.cte_tables.len());
    for cte in &with.cte_tables {
        if !cte.alias.columns.is_empty() {
            return Err(SqlError::new(
                pos(cte.alias.name.span.start),
                format!(
                    "column names after a WITH query's name (`{}`) are not supported yet by \
                     Sluice's SQL; name the columns in its SELECT list",
                    cte.alias
                ),
            ));
        }
        scoped.push((
            cte.alias.name.value.clone(),
            std::rc::Rc::new((*cte.query).clone()),
        ));
    }
    let n = scoped.len();
    catalog.ctes.borrow_mut().extend(scoped);
    let lowered = lower_set_expr(query.body.as_ref(), catalog, at, depth);
    let mut ctes = catalog.ctes.borrow_mut();
    let kept = ctes.len().saturating_sub(n);
    ctes.truncate(kept);
    lowered
}

/// Lowers a query's body: a SELECT, a query in parentheses, or a UNION of two.
fn lower_set_expr(body: &SetExpr, catalog: &Catalog<'_>, at: Pos, depth: usize) -> Result<Lowered> {
    match body {
        SetExpr::Select(select) => lower_select(select, catalog, depth),
        SetExpr::Query(q) => lower_query(q, catalog, at, depth + 1),
        SetExpr::SetOperation {
            op: sqlparser::ast::SetOperator::Union,
            set_quantifier,
            left,
            right,
        } => lower_union(left, right, *set_quantifier, catalog, at, depth),
        SetExpr::SetOperation {
            op,
            set_quantifier,
            left,
            right,
        } => lower_set_difference(op, left, right, *set_quantifier, catalog, at, depth),
        _ => Err(unsupported(at, "VALUES, and this kind of query")),
    }
}

/// The position of a query body's first SELECT.
fn body_at(body: &SetExpr, or: Pos) -> Pos {
    match body {
        SetExpr::Select(select) => pos(select.select_token.0.span.start),
        SetExpr::Query(q) => body_at(&q.body, or),
        SetExpr::SetOperation { left, .. } => body_at(left, or),
        _ => or,
    }
}

/// `left UNION ALL right`: the left side's pipeline, then a `union` item holding the
/// right side's source and pipeline. `UNION` without ALL is that, then each distinct row
/// once (a dedup by every column, as SELECT DISTINCT).
fn lower_union(
    left: &SetExpr,
    right: &SetExpr,
    quantifier: sqlparser::ast::SetQuantifier,
    catalog: &Catalog<'_>,
    at: Pos,
    depth: usize,
) -> Result<Lowered> {
    use sqlparser::ast::SetQuantifier;
    let union_at = body_at(right, at);
    let distinct = match quantifier {
        SetQuantifier::All => false,
        SetQuantifier::None | SetQuantifier::Distinct => true,
        other => return Err(unsupported(union_at, &format!("UNION {other}"))),
    };
    let (mut lowered, input) = set_sides(left, right, catalog, at, union_at, depth)?;
    lowered.pipeline.push(stage("union", input, union_at));
    if distinct {
        let names = set_output_names(left, union_at)?;
        lowered
            .pipeline
            .push(stage("dedup", seq(names, union_at), union_at));
    }
    Ok(lowered)
}

/// `a INTERSECT b` and `a EXCEPT b` (`MINUS`): each distinct row of `a` (a dedup by every
/// column), then a semi join (INTERSECT: the row is written once a row of `b` equals it)
/// or an anti join (EXCEPT: written while none does, taken back when one comes) keyed by
/// every column by position, whose keys compare nulls as equal, as set operations do.
fn lower_set_difference(
    op: &sqlparser::ast::SetOperator,
    left: &SetExpr,
    right: &SetExpr,
    quantifier: sqlparser::ast::SetQuantifier,
    catalog: &Catalog<'_>,
    at: Pos,
    depth: usize,
) -> Result<Lowered> {
    use sqlparser::ast::{SetOperator, SetQuantifier};
    let op_at = body_at(right, at);
    let (name, kind) = match op {
        SetOperator::Intersect => ("INTERSECT", "semi"),
        SetOperator::Except | SetOperator::Minus => ("EXCEPT", "anti"),
        other => return Err(unsupported(op_at, &other.to_string())),
    };
    match quantifier {
        SetQuantifier::None | SetQuantifier::Distinct => {}
        SetQuantifier::All => {
            return Err(unsupported(
                op_at,
                &format!("{name} ALL (each row as many times as both sides hold it)"),
            ));
        }
        other => return Err(unsupported(op_at, &format!("{name} {other}"))),
    }
    if catalog.join_ttl.is_some() {
        return Err(SqlError::new(
            op_at,
            format!(
                "{name} with 'table.exec.state.ttl' set: its join keeps both sides whole, it \
                 takes no state TTL yet"
            ),
        ));
    }
    let left_names = set_output_names(left, op_at)?;
    let right_names = set_output_names(right, op_at)?;
    if left_names.len() != right_names.len() {
        return Err(SqlError::new(
            op_at,
            format!(
                "{name} compares whole rows, but the left query has {} columns and the right \
                 {}",
                left_names.len(),
                right_names.len()
            ),
        ));
    }
    let (mut lowered, input) = set_sides(left, right, catalog, at, op_at, depth)?;
    lowered
        .pipeline
        .push(stage("dedup", seq(left_names.clone(), op_at), op_at));
    let mut spec = Section::default();
    spec.put(&["type"], scalar(kind, op_at))?;
    spec.put(&["right"], input)?;
    spec.put(&["left_keys"], seq(left_names, op_at))?;
    spec.put(&["right_keys"], seq(right_names, op_at))?;
    spec.put(&["null_safe"], scalar("true", op_at))?;
    lowered
        .pipeline
        .push(stage("join", spec.into_node(op_at), op_at));
    Ok(lowered)
}

/// The two sides of a set operation written at `op_at`: the left query lowered, and the
/// right as the other input of a union or join item.
fn set_sides(
    left: &SetExpr,
    right: &SetExpr,
    catalog: &Catalog<'_>,
    at: Pos,
    op_at: Pos,
    depth: usize,
) -> Result<(Lowered, Node)> {
    let lowered = lower_set_expr(left, catalog, at, depth + 1)?;
    if let Some(rank) = &lowered.rank {
        return Err(unbounded_rank(rank));
    }
    let other = lower_set_expr(right, catalog, at, depth + 1)?;
    Ok((lowered, other_input(other, catalog, op_at)?))
}

/// A join's or a union's other input: its source, watermark and pipeline (what a join's
/// `right:` or a `union:` item holds).
fn other_input(lowered: Lowered, catalog: &Catalog<'_>, at: Pos) -> Result<Node> {
    if let Some(rank) = &lowered.rank {
        return Err(unbounded_rank(rank));
    }
    let (source, watermark) = source_nodes(&catalog.tables[&lowered.source])?;
    let mut input = Section::default();
    input.put(&["source"], source)?;
    if let Some(w) = watermark {
        input.put(&["watermark"], w)?;
    }
    input.put(&["pipeline"], seq(lowered.pipeline, at))?;
    Ok(input.into_node(at))
}

/// The output column names of a query body (its first SELECT's).
fn set_output_names(body: &SetExpr, at: Pos) -> Result<Vec<Node>> {
    match body {
        SetExpr::Select(select) => {
            output_names(&select.projection, at, "a UNION, INTERSECT or EXCEPT")
        }
        SetExpr::Query(q) => set_output_names(&q.body, at),
        SetExpr::SetOperation { left, .. } => set_output_names(left, at),
        _ => Err(unsupported(at, "UNION without ALL over this query")),
    }
}

/// Lowers one SELECT (see [`lower_query`]).
fn lower_select(
    select: &sqlparser::ast::Select,
    catalog: &Catalog<'_>,
    depth: usize,
) -> Result<Lowered> {
    let at = pos(select.select_token.0.span.start);
    let distinct = match &select.distinct {
        None => false,
        Some(sqlparser::ast::Distinct::Distinct) => true,
        Some(_) => return Err(unsupported(at, "SELECT DISTINCT ON")),
    };
    if select.qualify.is_some() {
        return Err(unsupported(
            at,
            "QUALIFY; write Top-N as a subquery with ROW_NUMBER() and an enclosing WHERE rn \
             <= N",
        ));
    }
    let group_by = match &select.group_by {
        GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => exprs.as_slice(),
        _ => {
            return Err(unsupported(
                at,
                "GROUP BY ALL, ROLLUP, CUBE and GROUPING SETS",
            ));
        }
    };
    let mut items: Vec<SelectItem> = select.projection.clone();
    let mut group_by: Vec<Expr> = group_by.to_vec();
    let mut selection = select.selection.clone();
    let mut having = select.having.clone();
    // `k IN (SELECT ...)` and `[NOT] EXISTS (...)` conjuncts of WHERE: semi and anti
    // joins after the rest of WHERE.
    let outer_name = select.from.first().and_then(|f| table_name(&f.relation));
    let semis = subquery_joins(&mut selection, outer_name.as_deref(), at)?;
    let joined = join_from(&select.from, at)?;
    if let (Some(semi), Some(_)) = (semis.first(), &joined) {
        return Err(unsupported(
            semi.at,
            "IN and EXISTS subqueries in a query with a join; join in a view and filter it here",
        ));
    }
    // The input's event time, when a GROUP BY over it may cascade from its windows.
    let mut input_time = None;
    let (input, window) = match (joined, select.from.first()) {
        (Some(join), _) => {
            // An outer join's WHERE conjuncts on a side it keeps filter that side first;
            // the rest filter its result (a padded row included), so they stay after it.
            // An inner join takes the whole WHERE.
            let (on_join, after) = match join.preserves().contains(&true) {
                true => preserved_conjuncts(&join, selection.take()),
                false => (selection.take(), None),
            };
            selection = after;
            let feeds_more = distinct
                || !group_by.is_empty()
                || has_aggregate(&items)
                || has_over(&items)
                || selection.is_some()
                || having.is_some();
            if !feeds_more {
                // The join's own projection is the query's.
                return lower_join(
                    &join,
                    JoinOutput::Items(&items),
                    on_join.as_ref(),
                    catalog,
                    at,
                    depth,
                );
            }
            // The join emits the columns the rest of the query reads, under flat names
            // (`a.id` as `a__id`), and the query goes on over them.
            let columns = flatten_columns(
                &mut items,
                &mut group_by,
                selection.as_mut().into_iter().chain(having.as_mut()),
                at,
            )?;
            let lowered = lower_join(
                &join,
                JoinOutput::Columns(columns),
                on_join.as_ref(),
                catalog,
                at,
                depth,
            )?;
            (lowered, None)
        }
        (None, None) => return Err(SqlError::new(at, "a SELECT without FROM".to_owned())),
        (None, Some(from)) => {
            if let Some(c) = catalog.as_of_of(&from.relation) {
                return Err(SqlError::new(
                    c.at,
                    "FOR SYSTEM_TIME AS OF belongs to the table a join looks up, on its right"
                        .to_owned(),
                ));
            }
            if let Some(name) = table_name(&from.relation) {
                // `q.col` over a single FROM item named q is its column `col`.
                unqualify_all(&name, &mut items, &mut group_by, &mut selection);
                unqualify_all(&name, &mut [], &mut [], &mut having);
            }
            input_time = event_time_of(&from.relation, catalog, depth);
            single_input(&from.relation, catalog, at, depth)?
        }
    };
    let row_number = row_number_item(&items)?;
    let group_by = group_by.as_slice();
    let Lowered {
        source,
        mut pipeline,
        rank,
    } = input;
    let table = &catalog.tables[&source];
    if let Some(mut rank) = rank {
        if row_number.is_some() {
            return Err(unbounded_rank(&rank));
        }
        let (limit, rest) = rank_bound(&rank, selection.as_ref())?;
        let mut referenced = items.iter().any(|item| {
            matches!(item, SelectItem::Wildcard(_)) || mentions(&item.to_string(), &rank.column)
        });
        referenced |= rest.iter().any(|e| mentions(&e.to_string(), &rank.column));
        let project = rank.project.take();
        let column = rank.column.clone();
        pipeline.push(top_n_stage(rank, limit, referenced)?);
        if let Some(mut list) = project {
            if referenced {
                list.push(scalar(column, at));
            }
            pipeline.push(stage("select", seq(list, at), at));
        }
        selection = and_all(rest);
    }
    if let Some(predicate) = &selection {
        pipeline.push(stage("filter", expr_node(predicate, at), at));
    }
    for semi in semis {
        pipeline.push(semi_join_stage(&semi, catalog, depth)?);
    }
    if let Some(mut over) = over_aggregates(&items, &select.named_window)? {
        if row_number.is_some()
            || window.is_some()
            || !group_by.is_empty()
            || has_aggregate(&items)
            || distinct
        {
            return Err(SqlError::new(
                over.at,
                "an OVER aggregate cannot share its SELECT with GROUP BY, a window \
                 aggregate, another aggregate, ROW_NUMBER() or DISTINCT; compute it in a \
                 subquery"
                    .to_owned(),
            ));
        }
        let items = std::mem::take(&mut over.items);
        pipeline.push(over.stage(input_time.as_ref(), table, &source)?);
        if let Some(list) = projection(&items, at)? {
            pipeline.push(stage("select", seq(list, at), at));
        }
        return Ok(Lowered {
            source,
            pipeline,
            rank: None,
        });
    }
    if let Some((index, mut rank)) = row_number {
        if window.is_some() || !group_by.is_empty() || distinct {
            return Err(unsupported(
                rank.at,
                "ROW_NUMBER() together with GROUP BY, a window function or DISTINCT",
            ));
        }
        let rest: Vec<SelectItem> = items
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != index)
            .map(|(_, item)| item.clone())
            .collect();
        if let Some(list) = projection(&rest, at)? {
            if rank.reads.iter().all(|c| keeps(&rest, c)) {
                pipeline.push(stage("select", seq(list, at), at));
            } else {
                rank.project = Some(list);
            }
        }
        return Ok(Lowered {
            source,
            pipeline,
            rank: Some(rank),
        });
    }
    let aggregates = window.is_some() || !group_by.is_empty() || has_aggregate(&items);
    if let (Some(h), false) = (&having, aggregates) {
        return Err(SqlError::new(
            located(h, at),
            "HAVING filters the groups of a GROUP BY or an aggregate; this query has \
             neither (write WHERE)"
                .to_owned(),
        ));
    }
    let after = AfterAggregate::split(&items, having.as_ref(), group_by);
    match window {
        None if aggregates => {
            if distinct {
                return Err(unsupported(at, "SELECT DISTINCT over a GROUP BY"));
            }
            let windowing = match cascades(input_time.as_ref(), group_by, &after.inner) {
                true => input_time.as_ref().map(|t| Windowing::Cascade(&t.column)),
                false => None,
            };
            pipeline.extend(aggregate_stages(
                windowing,
                None,
                group_by,
                &after.inner,
                at,
            )?);
            pipeline.extend(after.stages(at)?);
        }
        None => {
            if let Some(list) = projection(&items, at)? {
                pipeline.push(stage("select", seq(list, at), at));
            }
            if distinct {
                // Each distinct row once, when first seen: the dedup operator keyed by
                // every column (an append-only result, as in Flink).
                let names = output_names(&items, at, "SELECT DISTINCT")?;
                pipeline.push(stage("dedup", seq(names, at), at));
            }
        }
        Some(mut w) => {
            if distinct {
                return Err(unsupported(at, "SELECT DISTINCT over a window aggregate"));
            }
            w.processing = table.proctime.as_deref() == Some(w.column.as_str());
            if !w.processing && table.watermark.is_none() {
                return Err(SqlError::new(
                    w.at,
                    format!(
                        "a window over `{source}` needs its event time: add `WATERMARK FOR \
                         {col} AS {col} - INTERVAL '4' SECOND` to CREATE TABLE {source} (or \
                         `p_time AS PROCTIME()` for a window in processing time over p_time)",
                        col = w.column
                    ),
                ));
            }
            let watermarked = table.watermark.as_ref().map(|c| c.column.as_str());
            match distinct_window_stages(&w, watermarked, group_by, &after.inner, at)? {
                Some(stages) => pipeline.extend(stages),
                None => pipeline.extend(aggregate_stages(
                    Some(Windowing::Tvf(&w)),
                    watermarked,
                    group_by,
                    &after.inner,
                    at,
                )?),
            }
            pipeline.extend(after.stages(at)?);
        }
    }
    Ok(Lowered {
        source,
        pipeline,
        rank: None,
    })
}

/// What one FROM item (not a join) reads, and its window function if it is one.
fn single_input(
    relation: &TableFactor,
    catalog: &Catalog<'_>,
    at: Pos,
    depth: usize,
) -> Result<(Lowered, Option<WindowCall>)> {
    Ok(match relation {
        TableFactor::Table {
            name, args: None, ..
        } => {
            let (name, at) = object_name(name)?;
            (catalog.read(&name, at, depth)?, None)
        }
        TableFactor::Derived {
            lateral: false,
            subquery,
            ..
        } => (lower_query(subquery, catalog, at, depth + 1)?, None),
        TableFactor::TableFunction { expr, .. } => {
            let w = window_function(expr)?;
            let (name, at) = &w.table;
            (catalog.read(name, *at, depth)?, Some(w))
        }
        other => {
            return Err(unsupported(
                pos(other.span().start),
                "this FROM item; read a table, or TABLE(TUMBLE | HOP | CUMULATE | SESSION(...))",
            ));
        }
    })
}

/// The two FROM items of a join and its ON (`None` for `FROM a, b`, whose WHERE holds
/// the condition).
struct JoinFrom<'q> {
    left: &'q TableFactor,
    right: &'q TableFactor,
    on: Option<&'q Expr>,
    at: Pos,
    /// `inner`, or the outer join's `left`, `right` or `full`.
    kind: &'static str,
}

impl JoinFrom<'_> {
    /// Per side, whether an outer join keeps its unmatched rows (padded with nulls).
    fn preserves(&self) -> [bool; 2] {
        match self.kind {
            "left" => [true, false],
            "right" => [false, true],
            "full" => [true, true],
            _ => [false, false],
        }
    }
}

/// What a join emits.
enum JoinOutput<'q> {
    /// The query's SELECT list (a join that is the whole query).
    Items(&'q [SelectItem]),
    /// These columns (`a.id AS a__id`; a bare `price`), for the rest of the query.
    Columns(Vec<String>),
}

/// The join a FROM clause writes, if it writes one: `a [INNER] JOIN b ON ...` or `a, b`.
fn join_from(from: &[TableWithJoins], at: Pos) -> Result<Option<JoinFrom<'_>>> {
    match from {
        [] => Ok(None),
        [one] if one.joins.is_empty() => Ok(None),
        [one] => {
            let join = match one.joins.as_slice() {
                [join] => join,
                [_, second, ..] => {
                    return Err(unsupported(
                        pos(second.relation.span().start),
                        "more than one JOIN in a FROM; join two tables in a subquery or view \
                         and join that",
                    ));
                }
                [] => return Ok(None),
            };
            let join_at = pos(join.relation.span().start);
            let (constraint, kind) = match &join.join_operator {
                JoinOperator::Join(c) | JoinOperator::Inner(c) => (c, "inner"),
                JoinOperator::Left(c) | JoinOperator::LeftOuter(c) => (c, "left"),
                JoinOperator::Right(c) | JoinOperator::RightOuter(c) => (c, "right"),
                JoinOperator::FullOuter(c) => (c, "full"),
                _ => {
                    return Err(unsupported(
                        join_at,
                        "this kind of join; write `[INNER] JOIN ... ON a.k = b.k`",
                    ));
                }
            };
            let JoinConstraint::On(on) = constraint else {
                return Err(unsupported(
                    join_at,
                    "a JOIN without ON (USING, NATURAL, CROSS); write `ON a.k = b.k`",
                ));
            };
            Ok(Some(JoinFrom {
                left: &one.relation,
                right: &join.relation,
                on: Some(on),
                at: join_at,
                kind,
            }))
        }
        [a, b] if a.joins.is_empty() && b.joins.is_empty() => Ok(Some(JoinFrom {
            left: &a.relation,
            right: &b.relation,
            on: None,
            at: pos(b.relation.span().start),
            kind: "inner",
        })),
        _ => Err(unsupported(
            at,
            "reading more than two tables in one FROM; join two in a subquery or view and \
             join that",
        )),
    }
}

/// `FROM a [AS x] [INNER] JOIN b [AS y] ON x.k = y.k [AND ...] [WHERE ...]` (or `FROM a
/// x, b y WHERE ...`) as a join item on `a`'s pipeline, `b` its right input. Equalities
/// between a column of each side (qualified by its table) are the keys; a conjunct that
/// names one side's columns only filters that side before the join; everything else is
/// the join's condition.
fn lower_join(
    join: &JoinFrom<'_>,
    output: JoinOutput<'_>,
    selection: Option<&Expr>,
    catalog: &Catalog<'_>,
    at: Pos,
    depth: usize,
) -> Result<Lowered> {
    let join_at = join.at;
    if let Some(c) = catalog.as_of_of(join.left) {
        return Err(SqlError::new(
            c.at,
            "FOR SYSTEM_TIME AS OF belongs to the table a join looks up, on its right".to_owned(),
        ));
    }
    if let Some(as_of) = catalog.as_of_of(join.right) {
        return lower_lookup_join(join, as_of, output, selection, catalog, at, depth);
    }
    let (left, left_alias) = join_input(join.left, catalog, at, depth)?;
    let (right, right_alias) = join_input(join.right, catalog, at, depth)?;
    if left_alias.eq_ignore_ascii_case(&right_alias) {
        return Err(SqlError::new(
            join_at,
            format!(
                "both sides of the join are called `{right_alias}`; give one an alias \
                 (`{right_alias} AS other`)"
            ),
        ));
    }
    let aliases = [left_alias.as_str(), right_alias.as_str()];
    // For an inner join, ON and WHERE are one condition. An outer join's ON conjuncts
    // on the side it pads filter that side first, and the WHERE conjuncts it is given
    // (the caller keeps the others after the join) name only a side it preserves.
    let preserves = join.preserves();
    let outer = preserves.contains(&true);
    let mut conjuncts = Vec::new();
    if let Some(on) = join.on {
        split_and(on, &mut conjuncts);
    }
    let from_on = conjuncts.len();
    if let Some(w) = selection {
        split_and(w, &mut conjuncts);
    }
    let (mut left_keys, mut right_keys, mut rest) = (Vec::new(), Vec::new(), Vec::new());
    let (mut left_pipeline, mut right_pipeline) = (left.pipeline, right.pipeline);
    for (i, c) in conjuncts.into_iter().enumerate() {
        let in_on = i < from_on;
        if let Expr::BinaryOp {
            left: a,
            op: BinaryOperator::Eq,
            right: b,
        } = &c
            && (in_on || !outer)
        {
            match (side_column(a, aliases), side_column(b, aliases)) {
                (Some((0, l)), Some((1, r))) | (Some((1, r)), Some((0, l))) => {
                    left_keys.push(l);
                    right_keys.push(r);
                    continue;
                }
                _ => {}
            }
        }
        let pushed = one_side(&c, aliases).filter(|&side| !outer || preserves[side] != in_on);
        match pushed {
            Some(side) => {
                let mut unqualified = c;
                unqualify(&mut unqualified, aliases[side]);
                let pipeline = if side == 0 {
                    &mut left_pipeline
                } else {
                    &mut right_pipeline
                };
                pipeline.push(stage("filter", expr_node(&unqualified, at), at));
            }
            None => rest.push(c),
        }
    }
    if left_keys.is_empty() {
        return Err(SqlError::new(
            join.on.map_or(join_at, |on| located(on, join_at)),
            format!(
                "a join needs an equality between a column of each side in ON, each \
                 qualified by its table (`{left_alias}.k = {right_alias}.k`); joins without \
                 one are not supported"
            ),
        ));
    }
    let right_input = Lowered {
        source: right.source.clone(),
        pipeline: right_pipeline,
        rank: None,
    };
    let mut spec = Section::default();
    spec.put(&["right"], other_input(right_input, catalog, join_at)?)?;
    if join.kind != "inner" {
        spec.put(&["type"], scalar(join.kind, join_at))?;
    }
    // Bounds between the two sides' event times make an interval join, whose rows leave
    // state as the watermark passes them (the condition still checks the bounds).
    let times = [join.left, join.right].map(|f| event_time_of(f, catalog, 0).map(|t| t.column));
    let interval = match times {
        [Some(l), Some(r)] => {
            // Equal times are a key (a window join's `P.window_end = A.window_end`): they
            // bound the interval at 0 both ways.
            let equal = left_keys
                .iter()
                .zip(&right_keys)
                .filter(|((a, _), (b, _))| *a == l && *b == r)
                .flat_map(|_| {
                    [true, false].map(|at_least| TimeBound {
                        at_least,
                        bound: 0,
                        columns: [l.clone(), r.clone()],
                    })
                });
            let bounds = rest
                .iter()
                .flat_map(|c| time_bounds(c, aliases))
                .chain(equal);
            join_interval(bounds, [&l, &r])
                .map(|(lower, left, upper, right)| (left, right, lower, upper))
        }
        _ => None,
    };
    let parts = JoinParts {
        other: "right",
        keys: [left_keys, right_keys],
        aliases: [left_alias, right_alias],
        rest,
        output,
    };
    parts.put(&mut spec, join_at, at)?;
    match interval {
        Some((left_time, right_time, lower, upper)) => {
            let mut bounds = Section::default();
            bounds.put(&["left"], scalar(left_time, join_at))?;
            bounds.put(&["right"], scalar(right_time, join_at))?;
            bounds.put(&["lower"], scalar(format!("{lower}ms"), join_at))?;
            bounds.put(&["upper"], scalar(format!("{upper}ms"), join_at))?;
            spec.put(&["interval"], bounds.into_node(join_at))?;
        }
        // An interval join's rows leave with the watermark; the TTL is a regular join's.
        None => {
            if let Some(ttl) = &catalog.join_ttl {
                spec.put(&["ttl"], ttl.clone())?;
            }
        }
    }
    left_pipeline.push(stage("join", spec.into_node(join_at), join_at));
    Ok(Lowered {
        source: left.source,
        pipeline: left_pipeline,
        rank: None,
    })
}

/// A processing-time temporal join (`JOIN t FOR SYSTEM_TIME AS OF l.p_time AS s ON
/// f(l.x) = s.k`): a `lookup_join` stage after the left input, which reads the table `t`
/// whole. Each key equality may compute its left side (a select ahead of the join adds
/// the value as a column); other conjuncts on the left side alone filter it first, the
/// rest are the join's condition.
fn lower_lookup_join(
    join: &JoinFrom<'_>,
    as_of: &AsOfClause,
    output: JoinOutput<'_>,
    selection: Option<&Expr>,
    catalog: &Catalog<'_>,
    at: Pos,
    depth: usize,
) -> Result<Lowered> {
    let join_at = join.at;
    if join.kind != "inner" {
        return Err(unsupported(
            join_at,
            "an outer join with FOR SYSTEM_TIME AS OF; write an inner JOIN",
        ));
    }
    let (left, left_alias) = join_input(join.left, catalog, at, depth)?;
    let TableFactor::Table {
        name,
        alias,
        args: None,
        ..
    } = join.right
    else {
        return Err(unsupported(
            as_of.at,
            "FOR SYSTEM_TIME AS OF after this FROM item",
        ));
    };
    let (table_name, name_at) = object_name(name)?;
    let Some(table) = catalog.tables.get(&table_name) else {
        if catalog.views.contains_key(&table_name) {
            return Err(SqlError::new(
                name_at,
                format!(
                    "`{table_name}` is a view; FOR SYSTEM_TIME AS OF looks up a table \
                     created WITH a bounded connector"
                ),
            ));
        }
        return Err(catalog.unknown(&table_name, name_at));
    };
    let table_alias = alias
        .as_ref()
        .map_or(table_name.clone(), |a| a.name.value.clone());
    let aliases = [left_alias.as_str(), table_alias.as_str()];
    // AS OF the left side's processing time: the table as it is when a row arrives.
    let proctime = catalog.tables[&left.source].proctime.as_deref();
    let column = match as_of.column.as_slice() {
        [t, c] if t.eq_ignore_ascii_case(&left_alias) => Some(c.as_str()),
        [c] => Some(c.as_str()),
        _ => None,
    };
    if column.is_none() || column != proctime {
        return Err(SqlError::new(
            as_of.column_at,
            format!(
                "FOR SYSTEM_TIME AS OF takes `{left_alias}`'s processing-time column (declared \
                 `p_time AS PROCTIME()` in its CREATE TABLE), found `{}`; temporal joins in \
                 event time are not supported yet",
                as_of.column.join(".")
            ),
        ));
    }
    let mut conjuncts = Vec::new();
    if let Some(on) = join.on {
        split_and(on, &mut conjuncts);
    }
    if let Some(w) = selection {
        split_and(w, &mut conjuncts);
    }
    let (mut left_keys, mut table_keys, mut computed, mut rest) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut left_pipeline = left.pipeline;
    for c in conjuncts {
        if let Expr::BinaryOp {
            left: a,
            op: BinaryOperator::Eq,
            right: b,
        } = &c
        {
            let pair = match (side_column(a, aliases), side_column(b, aliases)) {
                (_, Some((1, t))) if one_side(a, aliases) == Some(0) => Some((a, t)),
                (Some((1, t)), _) if one_side(b, aliases) == Some(0) => Some((b, t)),
                _ => None,
            };
            if let Some((l, t)) = pair {
                let key = match side_column(l, aliases) {
                    Some((0, (column, p))) => (column, p),
                    _ => {
                        let name = format!("sluice_lookup_key_{}", computed.len());
                        let mut value = l.as_ref().clone();
                        unqualify(&mut value, aliases[0]);
                        let p = located(l, join_at);
                        computed.push(scalar_quoted(format!("{value} AS {name}"), p));
                        (name, p)
                    }
                };
                left_keys.push(key);
                table_keys.push(t);
                continue;
            }
        }
        match one_side(&c, aliases) {
            Some(0) => {
                let mut unqualified = c;
                unqualify(&mut unqualified, aliases[0]);
                left_pipeline.push(stage("filter", expr_node(&unqualified, at), at));
            }
            _ => rest.push(c),
        }
    }
    if left_keys.is_empty() {
        return Err(SqlError::new(
            join.on.map_or(join_at, |on| located(on, join_at)),
            format!(
                "a lookup join needs an equality between the table's column and a value of \
                 the other side (`{table_alias}.k = {left_alias}.k`)"
            ),
        ));
    }
    if !computed.is_empty() {
        let items = std::iter::once(scalar_quoted("*".to_owned(), join_at))
            .chain(computed)
            .collect();
        left_pipeline.push(stage("select", seq(items, join_at), join_at));
    }
    let (source, _) = source_nodes(table)?;
    let mut spec = Section::default();
    spec.put(&["table"], source)?;
    let parts = JoinParts {
        other: "table",
        keys: [left_keys, table_keys],
        aliases: [left_alias, table_alias],
        rest,
        output,
    };
    parts.put(&mut spec, join_at, at)?;
    left_pipeline.push(stage("lookup_join", spec.into_node(join_at), join_at));
    Ok(Lowered {
        source: left.source,
        pipeline: left_pipeline,
        rank: None,
    })
}

/// What a `join` and a `lookup_join` item both hold.
struct JoinParts<'q> {
    /// The other side's name in the item's keys (`right`, or a lookup's `table`).
    other: &'static str,
    /// The left side's key columns and the other side's, pairwise equal.
    keys: [Vec<(String, Pos)>; 2],
    aliases: [String; 2],
    /// The conjuncts checked on each pair.
    rest: Vec<Expr>,
    output: JoinOutput<'q>,
}

impl JoinParts<'_> {
    /// Writes the keys, aliases, condition and output into `spec`.
    fn put(self, spec: &mut Section, join_at: Pos, at: Pos) -> Result<()> {
        let [left_keys, other_keys] = self.keys;
        let [left_alias, other_alias] = self.aliases;
        let names = |keys: Vec<(String, Pos)>| {
            let items = keys.into_iter().map(|(k, p)| scalar(k, p)).collect();
            seq(items, join_at)
        };
        let (keys, alias) = (
            format!("{}_keys", self.other),
            format!("{}_alias", self.other),
        );
        spec.put(&["left_keys"], names(left_keys))?;
        spec.put(&[keys.as_str()], names(other_keys))?;
        spec.put(&["left_alias"], scalar(left_alias, join_at))?;
        spec.put(&[alias.as_str()], scalar(other_alias, join_at))?;
        if let Some(condition) = and_all(self.rest) {
            spec.put(&["condition"], expr_node(&condition, join_at))?;
        }
        let select = match self.output {
            JoinOutput::Items(items) => projection(items, at)?,
            JoinOutput::Columns(columns) => {
                Some(columns.into_iter().map(|c| scalar_quoted(c, at)).collect())
            }
        };
        if let Some(items) = select {
            spec.put(&["select"], seq(items, at))?;
        }
        Ok(())
    }
}

/// The conjunction of `conjuncts`; `None` for none.
fn and_all(conjuncts: Vec<Expr>) -> Option<Expr> {
    // An OR among them keeps its parentheses: the text is parsed again.
    let nest = |e: Expr| match e {
        Expr::BinaryOp {
            op: BinaryOperator::Or,
            ..
        } => Expr::Nested(Box::new(e)),
        e => e,
    };
    conjuncts
        .into_iter()
        .map(nest)
        .reduce(|a, b| Expr::BinaryOp {
            left: Box::new(a),
            op: BinaryOperator::And,
            right: Box::new(b),
        })
}

/// An outer join's WHERE split into the conjuncts that name only a side the join
/// preserves (they filter that side first) and the rest (they filter its result).
fn preserved_conjuncts(
    join: &JoinFrom<'_>,
    selection: Option<Expr>,
) -> (Option<Expr>, Option<Expr>) {
    let Some(selection) = selection else {
        return (None, None);
    };
    let preserves = join.preserves();
    let aliases = [table_name(join.left), table_name(join.right)];
    let (Some(l), Some(r)) = (&aliases[0], &aliases[1]) else {
        return (None, Some(selection));
    };
    let mut conjuncts = Vec::new();
    split_and(&selection, &mut conjuncts);
    let (before, after): (Vec<Expr>, Vec<Expr>) = conjuncts
        .into_iter()
        .partition(|c| one_side(c, [l.as_str(), r.as_str()]).is_some_and(|side| preserves[side]));
    (and_all(before), and_all(after))
}

/// The name a join gives column `column` of the side called `table` when the rest of
/// the query reads it (`a.id` is `a__id`), lower case as SQL names are.
fn flat_name(table: &str, column: &str) -> String {
    format!("{}__{}", table.to_lowercase(), column.to_lowercase())
}

/// Rewrites `items` and `group_by` to read a join's output by flat names (`a.id` becomes
/// `a__id`; a SELECT item `a.id` keeps its name `id`), and returns the join's output
/// columns: each qualified column read, renamed, and each bare name as it is.
///
/// A `t.*` item makes the join emit t's columns by their own names; the rest of the
/// query reads them as `* EXCEPT (...)` the other columns the join emits.
fn flatten_columns<'a>(
    items: &mut [SelectItem],
    group_by: &mut [Expr],
    more: impl IntoIterator<Item = &'a mut Expr>,
    at: Pos,
) -> Result<Vec<String>> {
    use std::ops::ControlFlow;
    let mut columns: Vec<String> = Vec::new();
    let mut add = |c: String| {
        if !columns.contains(&c) {
            columns.push(c);
        }
    };
    let mut rewrite = |e: &mut Expr| {
        let _ = sqlparser::ast::visit_expressions_mut(e, |e| {
            match e {
                Expr::CompoundIdentifier(parts) if parts.len() == 2 => {
                    let (t, c) = (&parts[0].value, &parts[1].value);
                    let flat = flat_name(t, c);
                    add(format!("{t}.{c} AS {flat}"));
                    let span = parts[1].span;
                    *e = Expr::Identifier(Ident::with_span(span, flat));
                }
                Expr::Identifier(id) => add(id.value.clone()),
                _ => {}
            }
            ControlFlow::<()>::Continue(())
        });
    };
    for item in items.iter_mut() {
        match item {
            SelectItem::UnnamedExpr(e) => {
                let name = match e {
                    Expr::CompoundIdentifier(parts) if parts.len() == 2 => Some(parts[1].clone()),
                    _ => None,
                };
                rewrite(e);
                if let Some(alias) = name {
                    *item = SelectItem::ExprWithAlias {
                        expr: e.clone(),
                        alias,
                    };
                }
            }
            SelectItem::ExprWithAlias { expr, .. } => rewrite(expr),
            _ => {}
        }
    }
    for e in group_by.iter_mut() {
        rewrite(e);
    }
    for e in more {
        rewrite(e);
    }
    let wildcards: Vec<usize> = items
        .iter()
        .enumerate()
        .filter(|(_, item)| matches!(item, SelectItem::QualifiedWildcard(..)))
        .map(|(i, _)| i)
        .collect();
    match wildcards.as_slice() {
        [] => {}
        [i] => {
            let table = match &items[*i] {
                SelectItem::QualifiedWildcard(
                    sqlparser::ast::SelectItemQualifiedWildcardKind::ObjectName(name),
                    _,
                ) => object_name(name)?.0,
                other => return Err(unsupported(at, &format!("the select item `{other}`"))),
            };
            let others: Vec<Ident> = columns
                .iter()
                .map(|c| Ident::new(c.rsplit(" AS ").next().unwrap_or(c)))
                .collect();
            columns.insert(0, format!("{table}.*"));
            let mut options = sqlparser::ast::WildcardAdditionalOptions::default();
            if let Some((first, rest)) = others.split_first() {
                options.opt_except = Some(sqlparser::ast::ExceptSelectItem {
                    first_element: first.clone(),
                    additional_elements: rest.to_vec(),
                });
            }
            items[*i] = SelectItem::Wildcard(options);
        }
        _ => {
            return Err(unsupported(
                at,
                "two `t.*` items over a join that the query goes on to aggregate, rank or \
                 filter; list one side's columns",
            ));
        }
    }
    Ok(columns)
}

/// Whether the SELECT list calls a window function that is not an aggregate
/// (`ROW_NUMBER() OVER (...)`).
fn has_rank(items: &[SelectItem]) -> bool {
    items.iter().any(|item| {
        matches!(
            item,
            SelectItem::UnnamedExpr(Expr::Function(f))
                | SelectItem::ExprWithAlias { expr: Expr::Function(f), .. }
                if f.over.is_some() && !is_aggregate_name(f)
        )
    })
}

/// Whether the SELECT list calls a window function (`... OVER (...)`).
fn has_over(items: &[SelectItem]) -> bool {
    items.iter().any(|item| {
        matches!(
            item,
            SelectItem::UnnamedExpr(Expr::Function(f))
                | SelectItem::ExprWithAlias { expr: Expr::Function(f), .. }
                if f.over.is_some()
        )
    })
}

/// The name a single FROM item's columns may be qualified with: its alias, or the table's
/// name.
fn table_name(relation: &TableFactor) -> Option<String> {
    match relation {
        TableFactor::Table { name, alias, .. } => Some(match alias {
            Some(a) => a.name.value.clone(),
            None => object_name(name).ok()?.0,
        }),
        TableFactor::Derived { alias: Some(a), .. } => Some(a.name.value.clone()),
        _ => None,
    }
}

/// Writes `name.col` as `col` in the SELECT list, GROUP BY and WHERE of a query over one
/// FROM item called `name`.
fn unqualify_all(
    name: &str,
    items: &mut [SelectItem],
    group_by: &mut [Expr],
    selection: &mut Option<Expr>,
) {
    let strip = |e: &mut Expr| unqualify(e, name);
    for item in items.iter_mut() {
        match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => strip(e),
            SelectItem::QualifiedWildcard(
                sqlparser::ast::SelectItemQualifiedWildcardKind::ObjectName(table),
                options,
            ) if object_name(table).is_ok_and(|(t, _)| t.eq_ignore_ascii_case(name)) => {
                *item = SelectItem::Wildcard(options.clone());
            }
            _ => {}
        }
    }
    group_by.iter_mut().for_each(strip);
    if let Some(e) = selection.as_mut() {
        strip(e);
    }
}

/// One input of a join and the name its columns are qualified with.
fn join_input(
    factor: &TableFactor,
    catalog: &Catalog<'_>,
    at: Pos,
    depth: usize,
) -> Result<(Lowered, String)> {
    let (lowered, alias) = match factor {
        TableFactor::Table {
            name,
            alias,
            args: None,
            ..
        } => {
            let (name, name_at) = object_name(name)?;
            let lowered = catalog.read(&name, name_at, depth)?;
            let alias = alias.as_ref().map_or(name, |a| a.name.value.clone());
            (lowered, alias)
        }
        TableFactor::Derived {
            lateral: false,
            subquery,
            alias,
            ..
        } => {
            let Some(alias) = alias else {
                return Err(SqlError::new(
                    pos(factor.span().start),
                    "a subquery joined needs a name: `(SELECT ...) AS s`".to_owned(),
                ));
            };
            (
                lower_query(subquery, catalog, at, depth + 1)?,
                alias.name.value.clone(),
            )
        }
        other => {
            return Err(unsupported(
                pos(other.span().start),
                "this join input (window joins and joins of table functions); join tables, \
                 views or subqueries",
            ));
        }
    };
    if let Some(rank) = &lowered.rank {
        return Err(unbounded_rank(rank));
    }
    Ok((lowered, alias))
}

/// The event-time column of a join input, as Flink's time attributes go: a table's
/// WATERMARK column, and through a view or subquery the column that passes it on or the
/// `window_end` of a window aggregate over it (see [`query_event_time`]). A side without
/// one makes a regular join. `depth` counts the views and subqueries gone through.
fn event_time_of(factor: &TableFactor, catalog: &Catalog<'_>, depth: usize) -> Option<EventTime> {
    if depth > MAX_NESTING {
        return None;
    }
    match factor {
        TableFactor::Table {
            name, args: None, ..
        } => {
            let (name, _) = object_name(name).ok()?;
            if let Some(query) = catalog.cte(&name) {
                return query_event_time(&query, catalog, depth + 1);
            }
            match catalog.tables.get(&name) {
                Some(table) => Some(EventTime {
                    column: table.watermark.as_ref()?.column.clone(),
                    ends_windows: false,
                }),
                None => query_event_time(catalog.views.get(&name)?, catalog, depth + 1),
            }
        }
        TableFactor::Derived {
            lateral: false,
            subquery,
            ..
        } => query_event_time(subquery, catalog, depth + 1),
        _ => None,
    }
}

/// An append-only input's event-time column.
#[derive(Debug, Clone)]
struct EventTime {
    column: String,
    /// The column holds the ends of fired windows (a window aggregate's `window_end`,
    /// passed on), so that a GROUP BY over it is a cascading window aggregate.
    ends_windows: bool,
}

/// Whether `e` names `column` (bare or qualified).
fn names_column(e: &Expr, column: &str) -> bool {
    match e {
        Expr::Identifier(id) => id.value.eq_ignore_ascii_case(column),
        Expr::CompoundIdentifier(parts) => parts
            .last()
            .is_some_and(|id| id.value.eq_ignore_ascii_case(column)),
        _ => false,
    }
}

/// Whether a GROUP BY over an input with event time `time` is a cascading window
/// aggregate (Flink's window aggregation over a windowed input): it groups by the ends
/// of the upstream windows, so each group is complete once the watermark reaches its
/// end, and it fires then, append-only, and forgets the group. COUNT(DISTINCT) stays an
/// unbounded aggregate, which keeps the values seen.
fn cascades(time: Option<&EventTime>, group_by: &[Expr], items: &[SelectItem]) -> bool {
    time.is_some_and(|t| {
        t.ends_windows
            && group_by.iter().any(|g| names_column(g, &t.column))
            && !items.iter().any(has_distinct_aggregate)
    })
}

/// Whether `item` calls an aggregate with DISTINCT.
fn has_distinct_aggregate(item: &SelectItem) -> bool {
    use std::ops::ControlFlow;
    let found = sqlparser::ast::visit_expressions(item, |e| match e {
        Expr::Function(f) if is_distinct(f) => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    });
    found.is_break()
}

/// Whether the call is `f(DISTINCT ...)`.
fn is_distinct(f: &sqlparser::ast::Function) -> bool {
    matches!(&f.args, FunctionArguments::List(list)
        if list.duplicate_treatment == Some(DuplicateTreatment::Distinct))
}

/// `text` parsed as one SQL expression.
fn parse_expr(text: &str) -> std::result::Result<Expr, ParserError> {
    Parser::new(&GenericDialect {})
        .try_with_sql(text)
        .and_then(|mut p| p.parse_expr())
}

/// The output column of `query` that is an event time: its input's event-time column
/// passed on (by name or renamed) through filters and projections of an append-only
/// input, the `window_end` of a window aggregate over a table's event time (`SELECT
/// ..., window_end AS t FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), ...)) GROUP
/// BY ..., window_end`), or the end column a cascading window aggregate groups by. A
/// window's rows leave the aggregate when the watermark reaches its end, before the
/// watermark passes it, so that end bounds them as a watermark column bounds a table's
/// rows: a join on it keeps a row only until the watermark passes what it can meet
/// (Flink's window join). Other aggregates, ranks, DISTINCT and joins (updating or
/// re-timed results) and processing-time windows have none.
fn query_event_time(query: &Query, catalog: &Catalog<'_>, depth: usize) -> Option<EventTime> {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    let [from] = select.from.as_slice() else {
        return None;
    };
    let GroupByExpr::Expressions(grouped, _) = &select.group_by else {
        return None;
    };
    // An OVER aggregate passes its input's rows on with their times; a rank does not.
    if !from.joins.is_empty() || select.distinct.is_some() || has_rank(&select.projection) {
        return None;
    }
    // A semi join writes a row when its first match comes, maybe after the watermark
    // passed it: its rows have no event time (as Flink's regular joins).
    if select.selection.as_ref().is_some_and(holds_subquery) {
        return None;
    }
    let is_end = |e: &Expr| names_column(e, "window_end");
    let time = match &from.relation {
        TableFactor::TableFunction { expr, .. } => {
            let window = window_function(expr).ok()?;
            let watermark = catalog.tables.get(&window.table.0)?.watermark.as_ref()?;
            if watermark.column != window.column || !grouped.iter().any(is_end) {
                return None;
            }
            EventTime {
                column: "window_end".to_owned(),
                ends_windows: true,
            }
        }
        relation => {
            let time = event_time_of(relation, catalog, depth)?;
            let aggregates = !grouped.is_empty() || has_aggregate(&select.projection);
            if aggregates && !cascades(Some(&time), grouped, &select.projection) {
                return None;
            }
            time
        }
    };
    select.projection.iter().find_map(|item| {
        let column = match item {
            SelectItem::Wildcard(_) => time.column.clone(),
            SelectItem::UnnamedExpr(e) if names_column(e, &time.column) => time.column.clone(),
            SelectItem::ExprWithAlias { expr, alias } if names_column(expr, &time.column) => {
                alias.value.clone()
            }
            _ => return None,
        };
        Some(EventTime {
            column,
            ends_windows: time.ends_windows,
        })
    })
}

/// An interval join's bounds among `bounds` (the conjuncts', then equal times as a key),
/// when they set both: `(lower, left, upper, right)`, the tightest of each (the first of
/// equals). A left row can match no future right row once the watermark passes its
/// `left` column minus `lower` ms, and a right row no future left row once it passes its
/// `right` column plus `upper` ms.
///
/// Each conjunct compares a column of each side plus a constant (`a.t BETWEEN b.t -
/// INTERVAL '10' SECOND AND b.t`, or `>=`, `>`, `<=`, `<` either way round) as a bound on
/// `left column - right column`. A lower bound expires left rows: future right rows come
/// after the watermark by their event time, so it must compare the right side's event
/// time, with any left column (an auction's `expires`). An upper bound expires right rows
/// and must compare the left side's event time, with any right column. So `B.date_time
/// BETWEEN A.date_time AND A.expires` keeps each auction until it expires and each bid
/// until the watermark passes it.
fn join_interval(
    bounds: impl IntoIterator<Item = TimeBound>,
    times: [&str; 2],
) -> Option<(i64, String, i64, String)> {
    let (mut lower, mut upper) = (None::<(i64, String)>, None::<(i64, String)>);
    for b in bounds {
        if b.at_least && b.columns[1].eq_ignore_ascii_case(times[1]) {
            if lower.as_ref().is_none_or(|(l, _)| b.bound > *l) {
                lower = Some((b.bound, b.columns[0].clone()));
            }
        } else if !b.at_least
            && b.columns[0].eq_ignore_ascii_case(times[0])
            && upper.as_ref().is_none_or(|(u, _)| b.bound < *u)
        {
            upper = Some((b.bound, b.columns[1].clone()));
        }
    }
    let ((lower, left), (upper, right)) = (lower?, upper?);
    Some((lower, left, upper, right))
}

/// A bound on `left column - right column`: at least or at most `bound` ms.
struct TimeBound {
    at_least: bool,
    bound: i64,
    columns: [String; 2],
}

/// The bounds one conjunct sets between a column of each side (none when it compares no
/// two such columns).
fn time_bounds(c: &Expr, aliases: [&str; 2]) -> Vec<TimeBound> {
    match c {
        Expr::Nested(inner) => time_bounds(inner, aliases),
        Expr::Between {
            expr,
            negated: false,
            low,
            high,
        } => [
            time_compare(expr, &BinaryOperator::GtEq, low, aliases),
            time_compare(expr, &BinaryOperator::LtEq, high, aliases),
        ]
        .into_iter()
        .flatten()
        .collect(),
        Expr::BinaryOp { left, op, right } => {
            time_compare(left, op, right, aliases).into_iter().collect()
        }
        _ => Vec::new(),
    }
}

/// `a op b` over a column of each side as a bound on `left column - right column`.
fn time_compare(a: &Expr, op: &BinaryOperator, b: &Expr, aliases: [&str; 2]) -> Option<TimeBound> {
    let (side_a, column_a, offset_a) = time_operand(a, aliases)?;
    let (side_b, column_b, offset_b) = time_operand(b, aliases)?;
    if side_a == side_b {
        return None;
    }
    // left + oa op right + ob is (left - right) op (ob - oa); with the right side
    // first, the comparison turns round.
    let (at_least, bound) = match (side_a, op) {
        (0, BinaryOperator::GtEq | BinaryOperator::Gt) => (true, offset_b - offset_a),
        (0, BinaryOperator::LtEq | BinaryOperator::Lt) => (false, offset_b - offset_a),
        (_, BinaryOperator::GtEq | BinaryOperator::Gt) => (false, offset_a - offset_b),
        (_, BinaryOperator::LtEq | BinaryOperator::Lt) => (true, offset_a - offset_b),
        _ => return None,
    };
    let columns = if side_a == 0 {
        [column_a, column_b]
    } else {
        [column_b, column_a]
    };
    Some(TimeBound {
        at_least,
        bound,
        columns,
    })
}

/// A side's column plus a constant: `b.t`, `b.t - INTERVAL '10' SECOND`; the side, the
/// column and the constant in ms.
fn time_operand(e: &Expr, aliases: [&str; 2]) -> Option<(usize, String, i64)> {
    match e {
        Expr::Nested(inner) => time_operand(inner, aliases),
        Expr::BinaryOp {
            left,
            op: op @ (BinaryOperator::Plus | BinaryOperator::Minus),
            right,
        } => {
            let (side, column, offset) = time_operand(left, aliases)?;
            let Value::Scalar { text, .. } = duration(right, Pos::START).ok()?.value else {
                return None;
            };
            let ms = i64::try_from(crate::job_spec::parse_duration_ms(&text).ok()?).ok()?;
            match op {
                BinaryOperator::Plus => offset.checked_add(ms),
                _ => offset.checked_sub(ms),
            }
            .map(|offset| (side, column, offset))
        }
        _ => {
            let (side, (column, _)) = side_column(e, aliases)?;
            Some((side, column, 0))
        }
    }
}

/// `alias.column` of one side of a join: the side (0 left, 1 right) and the column.
fn side_column(e: &Expr, aliases: [&str; 2]) -> Option<(usize, (String, Pos))> {
    let Expr::CompoundIdentifier(parts) = e else {
        return None;
    };
    let [table, column] = parts.as_slice() else {
        return None;
    };
    let side = aliases
        .iter()
        .position(|a| a.eq_ignore_ascii_case(&table.value))?;
    Some((side, (column.value.clone(), pos(column.span.start))))
}

/// The side whose columns alone `e` reads (each qualified by that side's name), if any.
fn one_side(e: &Expr, aliases: [&str; 2]) -> Option<usize> {
    use std::ops::ControlFlow;
    let mut side = None;
    let outcome = sqlparser::ast::visit_expressions(e, |e| match e {
        Expr::Identifier(_) => ControlFlow::Break(()),
        Expr::CompoundIdentifier(_) => match side_column(e, aliases) {
            Some((s, _)) if side.is_none_or(|seen| seen == s) => {
                side = Some(s);
                ControlFlow::Continue(())
            }
            _ => ControlFlow::Break(()),
        },
        Expr::Subquery(_) | Expr::InSubquery { .. } | Expr::Exists { .. } => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    });
    if outcome.is_break() { None } else { side }
}

/// Writes `table.column` as `column` in `e`, for the columns of `table` (a join side's
/// filter on its own rows, a query over one FROM item).
fn unqualify(e: &mut Expr, table: &str) {
    use std::ops::ControlFlow;
    let _ = sqlparser::ast::visit_expressions_mut(e, |e| {
        if let Expr::CompoundIdentifier(parts) = e
            && let [t, column] = parts.as_slice()
            && t.value.eq_ignore_ascii_case(table)
        {
            *e = Expr::Identifier(column.clone());
        }
        ControlFlow::<()>::Continue(())
    });
}

/// The OVER aggregates of a SELECT list (`AVG(price) OVER (PARTITION BY auction ORDER BY
/// date_time ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) AS avg_price`): one `over` item
/// computes every call, and the list reads their columns.
struct PendingOver {
    /// `PARTITION BY`'s columns.
    partition: Vec<Node>,
    /// `ORDER BY`'s column and where it is written.
    order: (String, Pos),
    /// The frame as the `over` item's `rows` or `range` entry.
    frame: (&'static str, Node),
    /// Each call as `avg(price) AS name`.
    calls: Vec<Node>,
    /// The SELECT list with each call replaced by its column.
    items: Vec<SelectItem>,
    /// Where the first call is written.
    at: Pos,
}

impl PendingOver {
    /// The `over` item; `time` is the input's event time, checked to be what the rows are
    /// ordered by.
    fn stage(self, time: Option<&EventTime>, table: &Table, source: &str) -> Result<Node> {
        let (column, at) = &self.order;
        if table.proctime.as_deref() == Some(column.as_str()) {
            return Err(unsupported(
                *at,
                "an OVER aggregate ordered by processing time",
            ));
        }
        match time {
            Some(t) if t.column.eq_ignore_ascii_case(column) => {}
            Some(t) => {
                return Err(SqlError::new(
                    *at,
                    format!(
                        "an OVER aggregate orders rows by their event time: ORDER BY `{}` (the \
                         time attribute of its input), not `{column}`",
                        t.column
                    ),
                ));
            }
            None => {
                return Err(SqlError::new(
                    *at,
                    format!(
                        "an OVER aggregate orders rows by their event time, and this input has \
                         none: add `WATERMARK FOR {column} AS {column} - INTERVAL '4' SECOND` \
                         to CREATE TABLE {source}, or read it straight from a table"
                    ),
                ));
            }
        }
        let mut entries = vec![
            (
                scalar("partition_by", self.at),
                seq(self.partition, self.at),
            ),
            (scalar("order_by", *at), scalar(column.clone(), *at)),
        ];
        entries.push((scalar(self.frame.0, self.at), self.frame.1));
        Ok(map(
            vec![
                (scalar("over", self.at), map(entries, self.at)),
                (scalar("aggregate", self.at), seq(self.calls, self.at)),
            ],
            self.at,
        ))
    }
}

/// The SELECT list's OVER aggregates, when it has any; `windows` are the query's `WINDOW
/// w AS (...)` definitions. Every call must share one window, as in Flink.
fn over_aggregates(
    items: &[SelectItem],
    windows: &[sqlparser::ast::NamedWindowDefinition],
) -> Result<Option<PendingOver>> {
    let mut items = items.to_vec();
    let mut calls: Vec<Node> = Vec::new();
    let mut window: Option<(WindowSpec, String, Pos)> = None;
    let mut error: Option<SqlError> = None;
    for item in &mut items {
        let (expr, alias) = match item {
            SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.value.clone())),
            SelectItem::UnnamedExpr(expr) => (expr, None),
            _ => continue,
        };
        let bare = matches!(expr, Expr::Function(_));
        let mut renamed = false;
        let _ = sqlparser::ast::visit_expressions_mut(expr, |e| {
            let Expr::Function(f) = e else {
                return std::ops::ControlFlow::Continue(());
            };
            if f.over.is_none() || !is_aggregate_name(f) {
                return std::ops::ControlFlow::Continue(());
            }
            let call_at = pos(f.name.span().start);
            let result = (|| {
                let spec = over_window(f, windows, call_at)?;
                let text = spec.to_string();
                match &window {
                    Some((_, first, _)) if *first != text => {
                        return Err(SqlError::new(
                            call_at,
                            "OVER aggregates over different windows in one SELECT are not \
                             supported (Flink refuses them too); compute each in its own query"
                                .to_owned(),
                        ));
                    }
                    Some(_) => {}
                    None => window = Some((spec, text, call_at)),
                }
                if is_distinct(f) {
                    return Err(unsupported(call_at, "COUNT(DISTINCT ...) OVER (...)"));
                }
                let name = match (&alias, bare) {
                    (Some(alias), true) => alias.clone(),
                    (None, true) => {
                        return Err(SqlError::new(
                            call_at,
                            format!(
                                "name this OVER aggregate's column: `{} AS name`",
                                Expr::Function(f.clone())
                            ),
                        ));
                    }
                    _ => format!("sluice_over_{}", calls.len()),
                };
                let mut call = f.clone();
                call.over = None;
                calls.push(scalar_quoted(format!("{call} AS {name}"), call_at));
                Ok(Expr::Identifier(Ident::new(name)))
            })();
            match result {
                Ok(column) => {
                    *e = column;
                    renamed = bare;
                    std::ops::ControlFlow::Continue(())
                }
                Err(err) => {
                    error = Some(err);
                    std::ops::ControlFlow::Break(())
                }
            }
        });
        if let Some(err) = error {
            return Err(err);
        }
        if renamed {
            // The call's column has the item's name already.
            *item = SelectItem::UnnamedExpr(expr.clone());
        }
    }
    let Some((spec, _, first_at)) = window else {
        return Ok(None);
    };
    let partition = spec
        .partition_by
        .iter()
        .map(|e| match e {
            Expr::Identifier(id) => Ok(scalar(id.value.clone(), pos(id.span.start))),
            other => Err(SqlError::new(
                located(other, first_at),
                format!("PARTITION BY takes column names here, found `{other}`"),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    let order = match spec.order_by.as_slice() {
        [o] => match &o.expr {
            Expr::Identifier(id) if o.options.asc != Some(false) => {
                (id.value.clone(), pos(id.span.start))
            }
            Expr::Identifier(id) => {
                return Err(SqlError::new(
                    pos(id.span.start),
                    "an OVER aggregate orders rows by ascending event time; drop DESC".to_owned(),
                ));
            }
            other => {
                return Err(SqlError::new(
                    located(other, first_at),
                    format!("an OVER aggregate orders by its event-time column, found `{other}`"),
                ));
            }
        },
        [] => {
            return Err(SqlError::new(
                first_at,
                "an OVER aggregate needs ORDER BY its event-time column in OVER (...)".to_owned(),
            ));
        }
        [_, second, ..] => {
            return Err(unsupported(
                located(&second.expr, first_at),
                "an OVER aggregate ordered by more than its event time",
            ));
        }
    };
    let frame = over_frame(spec.window_frame.as_ref(), first_at)?;
    Ok(Some(PendingOver {
        partition,
        order,
        frame,
        calls,
        items,
        at: first_at,
    }))
}

/// Whether `f` names an aggregate function (built in or registered).
fn is_aggregate_name(f: &sqlparser::ast::Function) -> bool {
    sluice_common::aggregate_names::is_aggregate(&name_text(&f.name))
}

/// The window of an OVER call, its name looked up in `windows`.
fn over_window(
    f: &sqlparser::ast::Function,
    windows: &[sqlparser::ast::NamedWindowDefinition],
    at: Pos,
) -> Result<WindowSpec> {
    let mut name = match &f.over {
        Some(sqlparser::ast::WindowType::WindowSpec(spec)) if spec.window_name.is_none() => {
            return Ok(spec.clone());
        }
        Some(sqlparser::ast::WindowType::WindowSpec(_)) => {
            return Err(unsupported(at, "a window that extends a named window"));
        }
        Some(sqlparser::ast::WindowType::NamedWindow(name)) => name.clone(),
        None => return Err(SqlError::new(at, "an aggregate without OVER".to_owned())),
    };
    for _ in 0..=windows.len() {
        let found = windows
            .iter()
            .find(|w| w.0.value.eq_ignore_ascii_case(&name.value))
            .ok_or_else(|| {
                SqlError::new(
                    pos(name.span.start),
                    format!("no window `{name}`: define it in WINDOW {name} AS (...)"),
                )
            })?;
        match &found.1 {
            sqlparser::ast::NamedWindowExpr::WindowSpec(spec) => return Ok(spec.clone()),
            sqlparser::ast::NamedWindowExpr::NamedWindow(other) => name = other.clone(),
        }
    }
    Err(SqlError::new(
        pos(name.span.start),
        format!("the window `{name}` is defined by itself"),
    ))
}

/// An OVER frame as the `over` item's `rows` or `range` entry. Without one the frame is
/// SQL's default, every row up to the current one's peers.
fn over_frame(
    frame: Option<&sqlparser::ast::WindowFrame>,
    at: Pos,
) -> Result<(&'static str, Node)> {
    use sqlparser::ast::{WindowFrameBound, WindowFrameUnits};
    let Some(frame) = frame else {
        return Ok(("range", scalar("unbounded", at)));
    };
    let unit = match frame.units {
        WindowFrameUnits::Rows => "rows",
        WindowFrameUnits::Range => "range",
        WindowFrameUnits::Groups => return Err(unsupported(at, "a GROUPS frame")),
    };
    if !matches!(frame.end_bound, None | Some(WindowFrameBound::CurrentRow)) {
        return Err(unsupported(
            at,
            "an OVER frame that ends after CURRENT ROW (rows still to come)",
        ));
    }
    let value = match &frame.start_bound {
        WindowFrameBound::Preceding(None) => scalar("unbounded", at),
        WindowFrameBound::CurrentRow if unit == "rows" => scalar("0", at),
        WindowFrameBound::CurrentRow => scalar("0ms", at),
        WindowFrameBound::Preceding(Some(e)) if unit == "rows" => match e.as_ref() {
            Expr::Value(v) if matches!(&v.value, SqlValue::Number(..)) => {
                scalar(v.value.to_string(), located(e, at))
            }
            other => {
                return Err(SqlError::new(
                    located(other, at),
                    format!("a ROWS frame counts rows: `10 PRECEDING`, found `{other}`"),
                ));
            }
        },
        WindowFrameBound::Preceding(Some(e)) => duration(e, at)?,
        WindowFrameBound::Following(_) => {
            return Err(unsupported(
                at,
                "an OVER frame that starts after the current row",
            ));
        }
    };
    Ok((unit, value))
}

/// The SELECT list's `ROW_NUMBER() OVER (...) AS rn`, with its index; other window
/// functions are refused by name.
fn row_number_item(items: &[SelectItem]) -> Result<Option<(usize, PendingRank)>> {
    let mut found = None;
    for (index, item) in items.iter().enumerate() {
        let (expr, alias) = match item {
            SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias)),
            SelectItem::UnnamedExpr(expr) => (expr, None),
            _ => continue,
        };
        let Expr::Function(f) = expr else {
            continue;
        };
        let Some(over) = &f.over else {
            continue;
        };
        let at = pos(expr.span().start);
        let name = name_text(&f.name).to_ascii_uppercase();
        if sluice_common::aggregate_names::is_aggregate(&name) {
            continue; // an OVER aggregate (`over_aggregates`)
        }
        if name != "ROW_NUMBER" {
            return Err(SqlError::new(
                at,
                format!(
                    "the window function {name}() OVER (...) is not supported yet by Sluice's \
                     SQL; ROW_NUMBER() is, bounded by an enclosing WHERE (Top-N)"
                ),
            ));
        }
        let Some(alias) = alias else {
            return Err(SqlError::new(
                at,
                format!("name the row number: `{expr} AS rn`"),
            ));
        };
        if found.is_some() {
            return Err(unsupported(at, "two ROW_NUMBER() columns in one SELECT"));
        }
        let sqlparser::ast::WindowType::WindowSpec(spec) = over else {
            return Err(unsupported(at, "a named window in OVER"));
        };
        if spec.window_frame.is_some() {
            return Err(unsupported(at, "a window frame with ROW_NUMBER()"));
        }
        let partition = spec
            .partition_by
            .iter()
            .map(|e| match e {
                Expr::Identifier(id) => Ok(scalar(id.value.clone(), pos(id.span.start))),
                other => Err(SqlError::new(
                    pos(other.span().start),
                    format!("PARTITION BY takes column names here, found `{other}`"),
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        if spec.order_by.is_empty() {
            return Err(SqlError::new(
                at,
                "ROW_NUMBER() needs an ORDER BY in its OVER clause: which rows come first"
                    .to_owned(),
            ));
        }
        let order = spec
            .order_by
            .iter()
            .map(|o| {
                let Expr::Identifier(id) = &o.expr else {
                    return Err(SqlError::new(
                        pos(o.expr.span().start),
                        format!("ORDER BY takes column names here, found `{}`", o.expr),
                    ));
                };
                let mut text = id.value.clone();
                if o.options.asc == Some(false) {
                    text.push_str(" DESC");
                }
                match o.options.nulls_first {
                    Some(true) => text.push_str(" NULLS FIRST"),
                    Some(false) => text.push_str(" NULLS LAST"),
                    None => {}
                }
                Ok(scalar(text, pos(id.span.start)))
            })
            .collect::<Result<Vec<_>>>()?;
        let reads = spec
            .partition_by
            .iter()
            .chain(spec.order_by.iter().map(|o| &o.expr))
            .filter_map(|e| match e {
                Expr::Identifier(id) => Some(id.value.clone()),
                _ => None,
            })
            .collect();
        found = Some((
            index,
            PendingRank {
                column: alias.value.clone(),
                partition,
                order,
                at,
                reads,
                project: None,
            },
        ));
    }
    Ok(found)
}

fn unbounded_rank(rank: &PendingRank) -> SqlError {
    SqlError::new(
        rank.at,
        format!(
            "ROW_NUMBER() is supported as Top-N: select from this query and bound the row \
             number in the enclosing WHERE, e.g. `WHERE {} <= 10`",
            rank.column
        ),
    )
}

/// The Top-N limit in `selection` (`rn <= N`, `rn < N`, `rn = 1`, or flipped) and the
/// other conjuncts.
fn rank_bound(rank: &PendingRank, selection: Option<&Expr>) -> Result<(u64, Vec<Expr>)> {
    let mut conjuncts = Vec::new();
    if let Some(e) = selection {
        split_and(e, &mut conjuncts);
    }
    let is_rank = |e: &Expr| matches!(e, Expr::Identifier(id) if id.value == rank.column);
    let number = |e: &Expr| match e {
        Expr::Value(v) => match &v.value {
            SqlValue::Number(n, _) => n.parse::<u64>().ok(),
            _ => None,
        },
        _ => None,
    };
    let mut limit = None;
    let mut rest = Vec::new();
    for c in conjuncts {
        let bound = match &c {
            Expr::BinaryOp { left, op, right } => match (op, is_rank(left), is_rank(right)) {
                (BinaryOperator::LtEq, true, _) => number(right),
                (BinaryOperator::Lt, true, _) => number(right).map(|n| n.saturating_sub(1)),
                (BinaryOperator::GtEq, _, true) => number(left),
                (BinaryOperator::Gt, _, true) => number(left).map(|n| n.saturating_sub(1)),
                (BinaryOperator::Eq, true, _) if number(right) == Some(1) => Some(1),
                (BinaryOperator::Eq, _, true) if number(left) == Some(1) => Some(1),
                _ => None,
            },
            _ => None,
        };
        match bound {
            Some(n) if limit.is_none() => limit = Some((n, pos(c.span().start))),
            _ => rest.push(c),
        }
    }
    match limit {
        Some((0, at)) => Err(SqlError::new(
            at,
            format!("`{}` keeps no row; a Top-N keeps at least 1", rank.column),
        )),
        Some((n, _)) => Ok((n, rest)),
        None => Err(unbounded_rank(rank)),
    }
}

fn split_and(e: &Expr, out: &mut Vec<Expr>) {
    match e {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            split_and(left, out);
            split_and(right, out);
        }
        Expr::Nested(inner) => split_and(inner, out),
        other => out.push(other.clone()),
    }
}

/// Whether SQL text mentions `name` as a word.
fn mentions(text: &str, name: &str) -> bool {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .any(|w| w.eq_ignore_ascii_case(name))
}

/// The job file's `top_n` item.
fn top_n_stage(rank: PendingRank, limit: u64, with_rank: bool) -> Result<Node> {
    let at = rank.at;
    let mut item = Section::default();
    item.put(&["top_n", "partition_by"], seq(rank.partition, at))?;
    item.put(&["top_n", "order_by"], seq(rank.order, at))?;
    item.put(&["top_n", "limit"], scalar(limit.to_string(), at))?;
    if with_rank {
        item.put(&["top_n", "rank_column"], scalar(rank.column, at))?;
    }
    Ok(item.into_node(at))
}

/// A window table function: `TUMBLE(TABLE t, DESCRIPTOR(col), size)`, `HOP(TABLE t,
/// DESCRIPTOR(col), slide, size)`, `CUMULATE(TABLE t, DESCRIPTOR(col), step, size)` or
/// `SESSION(TABLE t, DESCRIPTOR(col), gap)`.
struct WindowCall {
    at: Pos,
    table: (String, Pos),
    column: String,
    /// The job file's window keys (`tumbling: 10s`, ...).
    kind: Vec<(&'static str, Node)>,
    /// Over the table's PROCTIME() column: the wall clock when a row arrives.
    processing: bool,
}

fn window_function(e: &Expr) -> Result<WindowCall> {
    let at = pos(e.span().start);
    let Expr::Function(f) = e else {
        return Err(unsupported(
            at,
            "this table function; use TUMBLE, HOP, CUMULATE or SESSION",
        ));
    };
    let name = name_text(&f.name).to_ascii_uppercase();
    let (params, usage) = match name.as_str() {
        "TUMBLE" => (1, "TUMBLE(TABLE t, DESCRIPTOR(time_column), size)"),
        "HOP" => (2, "HOP(TABLE t, DESCRIPTOR(time_column), slide, size)"),
        "SESSION" => (1, "SESSION(TABLE t, DESCRIPTOR(time_column), gap)"),
        "CUMULATE" => (2, "CUMULATE(TABLE t, DESCRIPTOR(time_column), step, size)"),
        _ => {
            return Err(SqlError::new(
                at,
                format!(
                    "unknown window function `{name}`; expected TUMBLE, HOP, CUMULATE or \
                     SESSION"
                ),
            ));
        }
    };
    let FunctionArguments::List(list) = &f.args else {
        return Err(SqlError::new(at, format!("expected {usage}")));
    };
    let args: Vec<&Expr> = list
        .args
        .iter()
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e),
            _ => Err(SqlError::new(
                at,
                format!("expected {usage} (named arguments are not supported yet)"),
            )),
        })
        .collect::<Result<_>>()?;
    if args.len() != 2 + params {
        return Err(SqlError::new(at, format!("expected {usage}")));
    }
    let table = match args[0] {
        Expr::Identifier(id) => (id.value.clone(), pos(id.span.start)),
        _ => return Err(SqlError::new(at, format!("expected {usage}"))),
    };
    let column = match args[1] {
        Expr::Function(d) if name_text(&d.name).eq_ignore_ascii_case("DESCRIPTOR") => {
            match &d.args {
                FunctionArguments::List(l) => match l.args.as_slice() {
                    [FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Identifier(c)))] => {
                        c.value.clone()
                    }
                    _ => return Err(SqlError::new(at, format!("expected {usage}"))),
                },
                _ => return Err(SqlError::new(at, format!("expected {usage}"))),
            }
        }
        _ => return Err(SqlError::new(at, format!("expected {usage}"))),
    };
    let kind = match name.as_str() {
        "TUMBLE" => vec![("tumbling", duration(args[2], at)?)],
        "HOP" => vec![
            ("sliding", duration(args[3], at)?),
            ("slide", duration(args[2], at)?),
        ],
        "CUMULATE" => vec![
            ("cumulate", duration(args[3], at)?),
            ("step", duration(args[2], at)?),
        ],
        _ => vec![("session", duration(args[2], at)?)],
    };
    Ok(WindowCall {
        at,
        table,
        column,
        kind,
        processing: false,
    })
}

/// Whether a SELECT list passes column `name` on under its own name.
fn keeps(items: &[SelectItem], name: &str) -> bool {
    items.iter().any(|item| match item {
        SelectItem::UnnamedExpr(Expr::Identifier(id)) => id.value == name,
        SelectItem::ExprWithAlias {
            expr: Expr::Identifier(id),
            alias,
        } => id.value == name && alias.value == name,
        SelectItem::Wildcard(options) => options.opt_except.as_ref().is_none_or(|x| {
            x.first_element.value != name && x.additional_elements.iter().all(|a| a.value != name)
        }),
        _ => false,
    })
}

/// Whether a SELECT list calls an aggregate function, built in or registered by the
/// program (a global aggregate without GROUP BY).
fn has_aggregate(items: &[SelectItem]) -> bool {
    items.iter().any(|item| {
        let (SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. }) = item else {
            return false;
        };
        holds_aggregate(e)
    })
}

/// Whether `e` holds a subquery (`IN (SELECT ...)`, `EXISTS (...)`, `(SELECT ...)`).
fn holds_subquery(e: &Expr) -> bool {
    use std::ops::ControlFlow;
    sqlparser::ast::visit_expressions(e, |e| match e {
        Expr::InSubquery { .. } | Expr::Exists { .. } | Expr::Subquery(_) => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    })
    .is_break()
}

/// A WHERE conjunct that is a subquery, as a join of the query's rows with its rows.
struct SubqueryJoin {
    /// `semi` (IN, EXISTS), `anti` (NOT EXISTS) or `not_in`.
    kind: &'static str,
    /// The outer query's columns, equal to the subquery's `right_keys`.
    left_keys: Vec<String>,
    right_keys: Vec<String>,
    subquery: Query,
    at: Pos,
}

/// Takes the `column IN (SELECT ...)` and `[NOT] EXISTS (SELECT ... WHERE inner.k =
/// outer.k ...)` conjuncts out of `selection` (`outer`: the name the query's FROM item
/// goes by, which EXISTS's correlated columns are qualified with). Any other subquery in
/// WHERE is refused by name.
fn subquery_joins(
    selection: &mut Option<Expr>,
    outer: Option<&str>,
    at: Pos,
) -> Result<Vec<SubqueryJoin>> {
    let Some(where_) = selection.as_ref().filter(|w| holds_subquery(w)) else {
        return Ok(Vec::new());
    };
    let mut conjuncts = Vec::new();
    split_and(where_, &mut conjuncts);
    let mut joins = Vec::new();
    let mut rest = Vec::new();
    for c in conjuncts {
        match c {
            Expr::InSubquery {
                expr,
                subquery,
                negated,
            } => {
                let c_at = located(&expr, at);
                let column = match *expr {
                    Expr::Identifier(id) => id.value,
                    Expr::CompoundIdentifier(parts) if parts.len() == 2 => parts[1].value.clone(),
                    other => {
                        return Err(SqlError::new(
                            c_at,
                            format!(
                                "IN (SELECT ...) of `{other}`: compute it as a column in a \
                                 subquery or view first, and test that column"
                            ),
                        ));
                    }
                };
                let right = single_output_name(&subquery.body, c_at)?;
                joins.push(SubqueryJoin {
                    // NOT IN: an anti join the join refuses over keys that may be null.
                    kind: if negated { "not_in" } else { "semi" },
                    left_keys: vec![column],
                    right_keys: vec![right],
                    subquery: *subquery,
                    at: c_at,
                });
            }
            Expr::Exists { subquery, negated } => {
                let c_at = located(
                    &Expr::Exists {
                        subquery: subquery.clone(),
                        negated,
                    },
                    at,
                );
                let mut join = correlated(*subquery, outer, c_at)?;
                join.kind = if negated { "anti" } else { "semi" };
                joins.push(join);
            }
            other if holds_subquery(&other) => {
                return Err(SqlError::new(
                    located(&other, at),
                    "this subquery in WHERE (a scalar subquery, or IN or EXISTS under OR or \
                     NOT) is not supported yet by Sluice's SQL; `column [NOT] IN (SELECT \
                     ...)` and `[NOT] EXISTS (...)` as conjuncts of WHERE are"
                        .to_owned(),
                ));
            }
            other => rest.push(other),
        }
    }
    *selection = and_all(rest);
    Ok(joins)
}

/// An EXISTS subquery as a join: the equalities of its WHERE between a column of the
/// outer query (qualified by `outer`) and one of its own are the keys; it keeps the rest
/// of its WHERE and selects its key columns.
fn correlated(mut query: Query, outer: Option<&str>, at: Pos) -> Result<SubqueryJoin> {
    let refuse = |what: &str| -> Result<SubqueryJoin> {
        Err(SqlError::new(
            at,
            format!("EXISTS over {what} is not supported yet by Sluice's SQL"),
        ))
    };
    let Some(outer) = outer else {
        return refuse("a query without a named FROM item");
    };
    let SetExpr::Select(select) = query.body.as_mut() else {
        return refuse("a UNION or a query in parentheses");
    };
    let grouped = !matches!(&select.group_by, GroupByExpr::Expressions(e, _) if e.is_empty());
    if grouped || select.having.is_some() || select.distinct.is_some() {
        return refuse("a GROUP BY, HAVING or DISTINCT");
    }
    let names_outer = |e: &Expr| {
        use std::ops::ControlFlow;
        sqlparser::ast::visit_expressions(e, |e| match e {
            Expr::CompoundIdentifier(parts)
                if parts.len() == 2 && parts[0].value.eq_ignore_ascii_case(outer) =>
            {
                ControlFlow::Break(())
            }
            _ => ControlFlow::Continue(()),
        })
        .is_break()
    };
    let column = |e: &Expr| match e {
        Expr::Identifier(id) => Some(id.value.clone()),
        Expr::CompoundIdentifier(parts) if parts.len() == 2 => Some(parts[1].value.clone()),
        _ => None,
    };
    let mut conjuncts = Vec::new();
    if let Some(w) = &select.selection {
        split_and(w, &mut conjuncts);
    }
    let (mut left_keys, mut inner_keys, mut rest) = (Vec::new(), Vec::new(), Vec::new());
    for c in conjuncts {
        if let Expr::BinaryOp {
            left: a,
            op: BinaryOperator::Eq,
            right: b,
        } = &c
        {
            let pair = match (names_outer(a), names_outer(b)) {
                (true, false) => Some((a, b)),
                (false, true) => Some((b, a)),
                _ => None,
            };
            if let Some((o, i)) = pair
                && let (Some(o), Some(_)) = (column(o), column(i))
            {
                left_keys.push(o);
                inner_keys.push((**i).clone());
                continue;
            }
        }
        if names_outer(&c) {
            return Err(SqlError::new(
                located(&c, at),
                format!(
                    "`{c}` reads the outer query's `{outer}` inside EXISTS; only equalities \
                     between one of its columns and one of the subquery's correlate (`x.k = \
                     {outer}.k`)"
                ),
            ));
        }
        rest.push(c);
    }
    if left_keys.is_empty() {
        return Err(SqlError::new(
            at,
            format!(
                "EXISTS needs an equality in its WHERE between one of its columns and one of \
                 `{outer}`'s (`x.k = {outer}.k`); an uncorrelated EXISTS is not supported"
            ),
        ));
    }
    let right_keys: Vec<String> = (0..inner_keys.len())
        .map(|i| format!("sluice_key_{i}"))
        .collect();
    select.projection = inner_keys
        .into_iter()
        .zip(&right_keys)
        .map(|(expr, name)| SelectItem::ExprWithAlias {
            expr,
            alias: Ident::new(name),
        })
        .collect();
    select.selection = and_all(rest);
    Ok(SubqueryJoin {
        kind: "semi",
        left_keys,
        right_keys,
        subquery: query,
        at,
    })
}

/// A subquery join's `join` item: the subquery lowered as its right input, `semi` (each
/// row of the query once, when a subquery row with its keys has been seen) or `anti`
/// (each row while none has).
fn semi_join_stage(join: &SubqueryJoin, catalog: &Catalog<'_>, depth: usize) -> Result<Node> {
    let at = join.at;
    if catalog.join_ttl.is_some() {
        return Err(SqlError::new(
            at,
            "IN and EXISTS subqueries with 'table.exec.state.ttl' set: a semi or anti join \
             keeps both sides whole, it takes no state TTL yet"
                .to_owned(),
        ));
    }
    let right = lower_query(&join.subquery, catalog, at, depth + 1)?;
    let input = other_input(right, catalog, at)?;
    let names = |keys: &[String]| seq(keys.iter().map(|k| scalar(k.clone(), at)).collect(), at);
    let mut spec = Section::default();
    spec.put(&["type"], scalar(join.kind, at))?;
    spec.put(&["right"], input)?;
    spec.put(&["left_keys"], names(&join.left_keys))?;
    spec.put(&["right_keys"], names(&join.right_keys))?;
    Ok(stage("join", spec.into_node(at), at))
}

/// The name of the one column a subquery gives (for `IN (SELECT x ...)`).
fn single_output_name(body: &SetExpr, at: Pos) -> Result<String> {
    let select = match body {
        SetExpr::Select(select) => select,
        SetExpr::Query(q) => return single_output_name(&q.body, at),
        _ => {
            return Err(unsupported(at, "IN over a UNION; put the UNION in a view"));
        }
    };
    let at = pos(select.select_token.0.span.start);
    match select.projection.as_slice() {
        [SelectItem::UnnamedExpr(Expr::Identifier(id))] => Ok(id.value.clone()),
        [SelectItem::UnnamedExpr(Expr::CompoundIdentifier(parts))] if parts.len() == 2 => {
            Ok(parts[1].value.clone())
        }
        [SelectItem::ExprWithAlias { alias, .. }] => Ok(alias.value.clone()),
        [SelectItem::UnnamedExpr(e)] => Err(SqlError::new(
            located(e, at),
            format!("name the column IN (SELECT ...) compares with: `{e} AS name`"),
        )),
        _ => Err(SqlError::new(
            at,
            "IN (SELECT ...) compares with one column: the subquery's SELECT list must be \
             exactly one"
                .to_owned(),
        )),
    }
}

/// Whether `f` calls an aggregate function (not as a window function, `OVER`).
fn is_aggregate_call(f: &sqlparser::ast::Function) -> bool {
    f.over.is_none() && sluice_common::aggregate_names::is_aggregate(&name_text(&f.name))
}

/// Whether `e` calls an aggregate function anywhere in it.
fn holds_aggregate(e: &Expr) -> bool {
    use std::ops::ControlFlow;
    sqlparser::ast::visit_expressions(e, |e| match e {
        Expr::Function(f) if is_aggregate_call(f) => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    })
    .is_break()
}

/// An aggregate query's SELECT list and HAVING, split around the aggregate operator:
/// what it computes, then what is computed from its rows.
struct AfterAggregate {
    /// The aggregate's own SELECT list: grouped columns and aggregate calls, each under
    /// a name (the query's, or a hidden `sluice_agg_N` for a call inside an expression).
    inner: Vec<SelectItem>,
    /// HAVING over `inner`'s names: a filter after the aggregate.
    having: Option<Expr>,
    /// The query's SELECT list over `inner`'s names; `None` when `inner` is it.
    outer: Option<Vec<SelectItem>>,
}

/// The prefix of the hidden columns holding aggregate calls made inside expressions.
const HIDDEN_AGGREGATE: &str = "sluice_agg_";

impl AfterAggregate {
    /// Splits `items` and `having`: an item that is a grouped column or a named
    /// aggregate call stays as it is; any other named expression (`SUM(a) / COUNT(*) AS
    /// r`, `k + 1 AS k1`) is computed after the aggregate, from hidden columns holding
    /// the calls it makes and the grouped columns it reads. HAVING reads them likewise.
    fn split(items: &[SelectItem], having: Option<&Expr>, group_by: &[Expr]) -> Self {
        use std::ops::ControlFlow;
        let mut inner: Vec<SelectItem> = Vec::new();
        let mut outer: Vec<SelectItem> = Vec::new();
        // Each aggregate call's text and the name of the column holding it.
        let mut calls: Vec<(String, Ident)> = Vec::new();
        for item in items {
            if let SelectItem::ExprWithAlias {
                expr: Expr::Function(f),
                alias,
            } = item
                && is_aggregate_call(f)
            {
                calls.push((f.to_string(), alias.clone()));
            }
        }
        let mut rewritten = false;
        // Columns the expressions after the aggregate read (grouped ones, or the
        // aggregate refuses them by name).
        let mut read: Vec<Ident> = Vec::new();
        let mut hide = |e: &mut Expr, inner: &mut Vec<SelectItem>| {
            let _ = sqlparser::ast::visit_expressions_mut(e, |e| {
                match e {
                    Expr::Function(f) if is_aggregate_call(f) => {
                        let text = f.to_string();
                        let name = match calls.iter().find(|(t, _)| *t == text) {
                            Some((_, name)) => name.clone(),
                            None => {
                                let name = Ident::with_span(
                                    f.span(),
                                    format!("{HIDDEN_AGGREGATE}{}", calls.len()),
                                );
                                inner.push(SelectItem::ExprWithAlias {
                                    expr: Expr::Function(f.clone()),
                                    alias: name.clone(),
                                });
                                calls.push((text, name.clone()));
                                name
                            }
                        };
                        *e = Expr::Identifier(name);
                    }
                    _ => {}
                }
                ControlFlow::<()>::Continue(())
            });
            // What is left to read: grouped columns and the hidden calls' columns.
            let _ = sqlparser::ast::visit_expressions(e, |e| {
                if let Expr::Identifier(id) = e
                    && !read.iter().any(|r| r.value == id.value)
                {
                    read.push(id.clone());
                }
                ControlFlow::<()>::Continue(())
            });
        };
        let mut hidden: Vec<SelectItem> = Vec::new();
        for item in items {
            match item {
                SelectItem::UnnamedExpr(Expr::Identifier(id)) => {
                    inner.push(item.clone());
                    outer.push(SelectItem::UnnamedExpr(Expr::Identifier(id.clone())));
                }
                SelectItem::ExprWithAlias {
                    expr: Expr::Identifier(_),
                    alias,
                } => {
                    inner.push(item.clone());
                    outer.push(SelectItem::UnnamedExpr(Expr::Identifier(alias.clone())));
                }
                SelectItem::ExprWithAlias {
                    expr: Expr::Function(f),
                    alias,
                } if is_aggregate_call(f) => {
                    inner.push(item.clone());
                    outer.push(SelectItem::UnnamedExpr(Expr::Identifier(alias.clone())));
                }
                // A grouped expression: the aggregate computes it ahead. A call of no
                // aggregate over none stays too: the aggregate names an unknown one.
                SelectItem::ExprWithAlias { expr, alias }
                    if group_by.iter().any(|g| g.to_string() == expr.to_string())
                        || matches!(expr, Expr::Function(_)) && !holds_aggregate(expr) =>
                {
                    inner.push(item.clone());
                    outer.push(SelectItem::UnnamedExpr(Expr::Identifier(alias.clone())));
                }
                SelectItem::ExprWithAlias { expr, alias } => {
                    rewritten = true;
                    let mut expr = expr.clone();
                    hide(&mut expr, &mut hidden);
                    outer.push(SelectItem::ExprWithAlias {
                        expr,
                        alias: alias.clone(),
                    });
                }
                // Unnamed expressions and `*`: the aggregate names what is wrong.
                other => {
                    inner.push(other.clone());
                    outer.push(other.clone());
                }
            }
        }
        let having = having.map(|h| {
            let mut h = h.clone();
            hide(&mut h, &mut hidden);
            h
        });
        if !rewritten && having.is_none() {
            return Self {
                inner: items.to_vec(),
                having: None,
                outer: None,
            };
        }
        inner.extend(hidden);
        // The grouped columns read after the aggregate that it does not already emit.
        let names: Vec<String> = inner.iter().filter_map(item_name).collect();
        for id in read {
            if !names.contains(&id.value) {
                inner.push(SelectItem::UnnamedExpr(Expr::Identifier(id)));
            }
        }
        // Only HAVING, reading nothing hidden: the aggregate's list is the query's.
        let same = !rewritten && inner.len() == outer.len();
        Self {
            inner,
            having,
            outer: (!same).then_some(outer),
        }
    }

    /// The stages after the aggregate: HAVING's filter, then the SELECT list's select.
    fn stages(self, at: Pos) -> Result<Vec<Node>> {
        let mut stages = Vec::new();
        if let Some(h) = &self.having {
            stages.push(stage("filter", expr_node(h, at), at));
        }
        if let Some(list) = self.outer
            && let Some(list) = projection(&list, at)?
        {
            stages.push(stage("select", seq(list, at), at));
        }
        Ok(stages)
    }
}

/// The column name a SELECT item gives its value, if it gives one.
fn item_name(item: &SelectItem) -> Option<String> {
    match item {
        SelectItem::UnnamedExpr(Expr::Identifier(id)) => Some(id.value.clone()),
        SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.clone()),
        _ => None,
    }
}

/// How a GROUP BY is windowed.
#[derive(Clone, Copy)]
enum Windowing<'a> {
    /// By a window table function: its `window_start` and `window_end` are grouped by.
    Tvf(&'a WindowCall),
    /// By the ends of upstream windows in this column, a key (see [`cascades`]).
    Cascade(&'a str),
}

/// The stages of a GROUP BY: by a window table function, a keyed window; by the ends of
/// upstream windows, a cascade; without either, an unbounded aggregate whose result is
/// a changelog.
fn aggregate_stages(
    windowing: Option<Windowing<'_>>,
    watermarked: Option<&str>,
    group_by: &[Expr],
    projection: &[SelectItem],
    at: Pos,
) -> Result<Vec<Node>> {
    let w = match windowing {
        Some(Windowing::Tvf(w)) => Some(w),
        _ => None,
    };
    // A GROUP BY expression is computed by a select ahead of the aggregate, under the
    // name the SELECT list gives it (`DATE_FORMAT(t, 'yyyy-MM-dd') AS day`) or a hidden
    // one; that select also passes on every column the rest reads.
    let (computed, projection) = grouped_expressions(w, group_by, projection, at)?;
    let group_by = computed.group_by.as_slice();
    let projection = projection.as_slice();
    let mut keys: Vec<&Ident> = Vec::new();
    let mut bounds = 0;
    for g in group_by {
        let Expr::Identifier(id) = g else {
            return Err(SqlError::new(
                pos(g.span().start),
                format!("GROUP BY takes column names and expressions here, found `{g}`"),
            ));
        };
        match id.value.as_str() {
            "window_start" | "window_end" if w.is_some() => bounds += 1,
            _ => keys.push(id),
        }
    }
    if let Some(w) = w
        && bounds != 2
    {
        return Err(SqlError::new(
            w.at,
            "a window aggregate groups by window_start and window_end (and its key \
             columns)"
                .to_owned(),
        ));
    }
    let is_key = |id: &Ident| keys.iter().any(|k| k.value == id.value);
    let is_bound =
        |id: &Ident| w.is_some() && matches!(id.value.as_str(), "window_start" | "window_end");
    let mut aggregates = Vec::new();
    let mut aggregate_names = Vec::new();
    // Output columns in SELECT order, as the final select names them.
    let mut outputs: Vec<(String, Pos)> = Vec::new();
    let mut renamed = false;
    for item in projection {
        match item {
            SelectItem::UnnamedExpr(Expr::Identifier(id)) if is_key(id) || is_bound(id) => {
                outputs.push((id.value.clone(), pos(id.span.start)));
            }
            SelectItem::ExprWithAlias {
                expr: Expr::Identifier(id),
                alias,
            } if is_key(id) || is_bound(id) => {
                renamed = true;
                outputs.push((format!("{id} AS {alias}"), pos(id.span.start)));
            }
            SelectItem::UnnamedExpr(Expr::Identifier(id)) => {
                return Err(SqlError::new(
                    pos(id.span.start),
                    format!(
                        "column `{}` is neither grouped nor aggregated; add it to GROUP BY \
                         or aggregate it",
                        id.value
                    ),
                ));
            }
            SelectItem::ExprWithAlias { expr, alias } => {
                let p = pos(expr.span().start);
                aggregates.push(scalar_quoted(format!("{expr} AS {alias}"), p));
                aggregate_names.push(alias.to_string());
                outputs.push((alias.to_string(), p));
            }
            SelectItem::UnnamedExpr(e) => {
                return Err(SqlError::new(
                    pos(e.span().start),
                    format!("name the aggregate: `{e} AS name`"),
                ));
            }
            _ => {
                return Err(unsupported(at, "`*` in an aggregate's SELECT list"));
            }
        }
    }
    if aggregates.is_empty() {
        // Grouping alone (each group once, as Nexmark q8 groups persons per window): the
        // operators count the rows, and the final select leaves the count out.
        let hidden = "sluice_group_rows";
        if keys.iter().any(|k| k.value == hidden) {
            return Err(SqlError::new(
                at,
                format!("`{hidden}` is a name Sluice uses here; rename the column"),
            ));
        }
        aggregates.push(scalar_quoted(format!("count(*) AS {hidden}"), at));
        aggregate_names.push(hidden.to_owned());
    }
    let mut stages = computed.select.into_iter().collect::<Vec<_>>();
    let key_nodes: Vec<Node> = keys
        .iter()
        .map(|k| scalar(k.value.clone(), pos(k.span.start)))
        .collect();
    let key_names = keys.iter().map(|k| k.value.clone());
    let mut item = Section::default();
    let natural: Vec<String> = match w {
        Some(w) => {
            if !key_nodes.is_empty() {
                stages.push(stage("key_by", seq(key_nodes, at), at));
            }
            let mut window = Section::default();
            for (k, v) in &w.kind {
                window.put(&[k], v.clone())?;
            }
            if w.processing {
                window.put(&["time"], scalar("processing", w.at))?;
            } else if watermarked != Some(w.column.as_str()) {
                window.put(&["column"], scalar(w.column.clone(), w.at))?;
            }
            item.put(&["window"], window.into_node(w.at))?;
            // The window's own output: keys, its bounds, then the aggregates.
            key_names
                .chain(["window_start".to_owned(), "window_end".to_owned()])
                .chain(aggregate_names)
                .collect()
        }
        None => match windowing {
            Some(Windowing::Cascade(column)) => {
                // Keyed by every grouped column, the end among them; the window emits
                // the keys and the aggregates.
                stages.push(stage("key_by", seq(key_nodes, at), at));
                let mut window = Section::default();
                window.put(&["cascade"], scalar(column.to_owned(), at))?;
                item.put(&["window"], window.into_node(at))?;
                key_names.chain(aggregate_names).collect()
            }
            _ => {
                item.put(&["group_by"], seq(key_nodes, at))?;
                key_names.chain(aggregate_names).collect()
            }
        },
    };
    item.put(&["aggregate"], seq(aggregates, at))?;
    stages.push(item.into_node(w.map_or(at, |w| w.at)));
    let written: Vec<&str> = outputs.iter().map(|(o, _)| o.as_str()).collect();
    if renamed || written != natural.iter().map(String::as_str).collect::<Vec<_>>() {
        let items = outputs
            .into_iter()
            .map(|(o, p)| scalar_quoted(o, p))
            .collect();
        stages.push(stage("select", seq(items, at), at));
    }
    Ok(stages)
}

/// The column of the first window's rows holding the counted value of
/// `COUNT(DISTINCT x)` in a window (see [`distinct_window_stages`]).
const DISTINCT_VALUE: &str = "sluice_distinct_value";

/// A window aggregate with `COUNT(DISTINCT x)`, as two: the window aggregate grouped also
/// by `x` (one row per distinct value, key and window, with the other aggregates'
/// partial results and, per FILTER of a distinct count, how many rows passed it), then a
/// cascade over its windows' ends that counts those rows per key and window and merges
/// the partial results (Flink splits distinct aggregates likewise). Both keep only open
/// windows; the result is append-only, one row per key and window as without DISTINCT.
/// `None` when the query counts nothing DISTINCT.
///
/// Every DISTINCT count reads the same `x`; beside them, `COUNT`, `SUM`, `MIN`, `MAX` and
/// `AVG` (with FILTERs) merge, registered functions do not. Sessions are per key, so
/// a session window cannot be grouped by `x` too, and a processing-time window has no
/// event time to cascade on.
fn distinct_window_stages(
    w: &WindowCall,
    watermarked: Option<&str>,
    group_by: &[Expr],
    items: &[SelectItem],
    at: Pos,
) -> Result<Option<Vec<Node>>> {
    let calls: Vec<(usize, &sqlparser::ast::Function, &Ident)> = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| match item {
            SelectItem::ExprWithAlias {
                expr: Expr::Function(f),
                alias,
            } => Some((i, f, alias)),
            _ => None,
        })
        .collect();
    let distinct_arg = |f: &sqlparser::ast::Function| match &f.args {
        FunctionArguments::List(list) if is_distinct(f) => match list.args.as_slice() {
            [FunctionArg::Unnamed(FunctionArgExpr::Expr(e))] => Some(e.clone()),
            _ => None,
        },
        _ => None,
    };
    let Some((first_at, value)) = calls
        .iter()
        .find_map(|(_, f, _)| Some((pos(f.span().start), distinct_arg(f)?)))
    else {
        return Ok(None);
    };
    let refuse = |at: Pos, what: String| Err(SqlError::new(at, what));
    if w.processing {
        return refuse(
            first_at,
            "COUNT(DISTINCT ...) in a processing-time window is not supported yet".into(),
        );
    }
    if w.kind.iter().any(|(k, _)| *k == "session") {
        return refuse(
            first_at,
            "COUNT(DISTINCT ...) in a SESSION window is not supported yet (sessions are per \
             key, not per key and value)"
                .into(),
        );
    }
    let mut keys: Vec<Ident> = Vec::new();
    for g in group_by {
        match g {
            Expr::Identifier(id) if matches!(id.value.as_str(), "window_start" | "window_end") => {}
            Expr::Identifier(id) => keys.push(id.clone()),
            other => {
                return refuse(
                    pos(other.span().start),
                    format!(
                        "GROUP BY `{other}` beside COUNT(DISTINCT ...) in a window is not \
                         supported yet; compute it in a subquery and group by its name"
                    ),
                );
            }
        }
    }
    let parse = |text: &str| parse_expr(text).map_err(parser_error);
    let bounds = ["window_start", "window_end"].map(|b| Expr::Identifier(Ident::new(b)));
    let column = |name: &Ident| SelectItem::UnnamedExpr(Expr::Identifier(name.clone()));
    // The first window: keys, the value, its bounds, then the partial results.
    let mut first: Vec<SelectItem> = keys.iter().map(column).collect();
    first.push(SelectItem::ExprWithAlias {
        expr: value.clone(),
        alias: Ident::new(DISTINCT_VALUE),
    });
    first.extend(bounds.iter().cloned().map(SelectItem::UnnamedExpr));
    let mut first_group: Vec<Expr> = keys.iter().cloned().map(Expr::Identifier).collect();
    first_group.push(value.clone());
    first_group.extend(bounds.iter().cloned());
    // The cascade: the SELECT list with each aggregate merging its partials.
    let mut second: Vec<SelectItem> = items.to_vec();
    for (i, f, alias) in calls {
        let partial = format!("sluice_partial_{i}");
        let call_at = pos(f.span().start);
        let merged = match distinct_arg(f) {
            Some(arg) if arg.to_string() != value.to_string() => {
                return refuse(
                    call_at,
                    format!(
                        "COUNT(DISTINCT ...) of two values in one window is not supported \
                         yet: this one counts `{arg}`, an earlier one `{value}`"
                    ),
                );
            }
            Some(_) => match &f.filter {
                Some(filter) => {
                    first.push(SelectItem::ExprWithAlias {
                        expr: parse(&format!("COUNT(*) FILTER (WHERE {filter})"))?,
                        alias: Ident::new(&partial),
                    });
                    format!("COUNT({DISTINCT_VALUE}) FILTER (WHERE {partial} > 0)")
                }
                None => format!("COUNT({DISTINCT_VALUE})"),
            },
            None if matches!(
                name_text(&f.name).to_ascii_lowercase().as_str(),
                "avg" | "mean"
            ) =>
            {
                // An average merges as the sum of its sums over the sum of its counts
                // (null where no value was counted, as AVG's).
                for (merge, suffix) in [("SUM", "sum"), ("COUNT", "count")] {
                    let mut part = f.clone();
                    part.name = ObjectName(vec![ObjectNamePart::Identifier(Ident::new(merge))]);
                    first.push(SelectItem::ExprWithAlias {
                        expr: Expr::Function(part),
                        alias: Ident::new(format!("{partial}_{suffix}")),
                    });
                }
                format!("CAST(SUM({partial}_sum) AS DOUBLE) / NULLIF(SUM({partial}_count), 0)")
            }
            None => {
                let merge = match name_text(&f.name).to_ascii_lowercase().as_str() {
                    "count" | "sum" => "SUM",
                    "min" => "MIN",
                    "max" => "MAX",
                    _ => {
                        return refuse(
                            call_at,
                            format!(
                                "`{f}` beside COUNT(DISTINCT ...) in a window is not supported \
                                 yet (COUNT, SUM, MIN, MAX and AVG are)"
                            ),
                        );
                    }
                };
                first.push(SelectItem::ExprWithAlias {
                    expr: Expr::Function(f.clone()),
                    alias: Ident::new(&partial),
                });
                format!("{merge}({partial})")
            }
        };
        second[i] = SelectItem::ExprWithAlias {
            expr: parse(&merged)?,
            alias: alias.clone(),
        };
    }
    let mut second_group: Vec<Expr> = keys.into_iter().map(Expr::Identifier).collect();
    second_group.extend(bounds);
    let mut stages = aggregate_stages(
        Some(Windowing::Tvf(w)),
        watermarked,
        &first_group,
        &first,
        at,
    )?;
    // An average's merge is an expression over two aggregates: computed after them.
    let after = AfterAggregate::split(&second, None, &second_group);
    stages.extend(aggregate_stages(
        Some(Windowing::Cascade("window_end")),
        None,
        &second_group,
        &after.inner,
        at,
    )?);
    stages.extend(after.stages(at)?);
    Ok(Some(stages))
}

/// A GROUP BY whose expressions were computed ahead of the aggregate.
struct Grouped {
    /// The GROUP BY as column names.
    group_by: Vec<Expr>,
    /// The select computing them, when one is needed.
    select: Option<Node>,
}

/// Rewrites each GROUP BY expression that is not a column name into a column computed
/// by a select ahead of the aggregate: named as the SELECT item that writes the same
/// expression with an alias (which then reads the column), or `sluice_group_N`. The
/// select also passes on the columns the SELECT list and the window read.
fn grouped_expressions(
    w: Option<&WindowCall>,
    group_by: &[Expr],
    projection: &[SelectItem],
    at: Pos,
) -> Result<(Grouped, Vec<SelectItem>)> {
    use std::ops::ControlFlow;
    if group_by.iter().all(|g| matches!(g, Expr::Identifier(_))) {
        return Ok((
            Grouped {
                group_by: group_by.to_vec(),
                select: None,
            },
            projection.to_vec(),
        ));
    }
    let mut items = projection.to_vec();
    let mut computed: Vec<Node> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut rewritten = Vec::with_capacity(group_by.len());
    for (n, g) in group_by.iter().enumerate() {
        if let Expr::Identifier(_) = g {
            rewritten.push(g.clone());
            continue;
        }
        let gp = pos(g.span().start);
        let text = g.to_string();
        let named = items.iter().position(|item| match item {
            SelectItem::ExprWithAlias { expr, .. } => expr.to_string() == text,
            _ => false,
        });
        let name = match named {
            Some(i) => {
                let SelectItem::ExprWithAlias { alias, .. } = &items[i] else {
                    unreachable!("position matched an aliased item");
                };
                let alias = alias.clone();
                items[i] = SelectItem::UnnamedExpr(Expr::Identifier(alias.clone()));
                alias
            }
            None => Ident::with_span(g.span(), format!("sluice_group_{n}")),
        };
        if let Some(item) = items
            .iter()
            .find(|item| matches!(item, SelectItem::UnnamedExpr(e) if e.to_string() == text))
        {
            return Err(SqlError::new(
                located_item(item, gp),
                format!("name the grouped expression: `{text} AS name`"),
            ));
        }
        computed.push(scalar_quoted(format!("{text} AS {name}"), gp));
        names.push(name.value.clone());
        rewritten.push(Expr::Identifier(name));
    }
    // Every other column read: plain GROUP BY columns, the aggregates' arguments and
    // filters, and the window's time column.
    let mut read: Vec<String> = Vec::new();
    let mut note = |name: &str| {
        if !names.iter().any(|n| n == name) && !read.iter().any(|r| r == name) {
            read.push(name.to_owned());
        }
    };
    for g in &rewritten {
        if let Expr::Identifier(id) = g
            && !matches!(id.value.as_str(), "window_start" | "window_end")
        {
            note(&id.value);
        }
    }
    if let Some(w) = w.filter(|w| !w.processing) {
        note(&w.column);
    }
    for item in &items {
        let (SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. }) = item else {
            return Err(unsupported(at, "`*` in an aggregate's SELECT list"));
        };
        if let Expr::Identifier(_) = e {
            continue;
        }
        let _ = sqlparser::ast::visit_expressions(e, |e| {
            if let Expr::Identifier(id) = e {
                note(&id.value);
            }
            ControlFlow::<()>::Continue(())
        });
    }
    let list = read
        .into_iter()
        .map(|c| scalar(c, at))
        .chain(computed)
        .collect();
    Ok((
        Grouped {
            group_by: rewritten,
            select: Some(stage("select", seq(list, at), at)),
        },
        items,
    ))
}

/// Where a SELECT item starts.
fn located_item(item: &SelectItem, fallback: Pos) -> Pos {
    match item {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
            located(e, fallback)
        }
        _ => fallback,
    }
}

/// A plain query's SELECT list as select items; `None` for `SELECT *`.
fn projection(items: &[SelectItem], at: Pos) -> Result<Option<Vec<Node>>> {
    if let [SelectItem::Wildcard(options)] = items
        && options.opt_except.is_none()
    {
        return Ok(None);
    }
    items
        .iter()
        .map(|item| match item {
            // `* EXCEPT (...)` (a join's `t.*` read after it) and a join's own `t.*`.
            SelectItem::Wildcard(options) if options.opt_except.is_some() => {
                Ok(scalar_quoted(item.to_string(), at))
            }
            SelectItem::QualifiedWildcard(..) => Ok(scalar_quoted(item.to_string(), at)),
            SelectItem::UnnamedExpr(e) => Ok(expr_node(e, at)),
            SelectItem::ExprWithAlias { expr, alias } => Ok(scalar_quoted(
                format!("{expr} AS {alias}"),
                located(expr, at),
            )),
            _ => Err(unsupported(at, "`*` next to other columns, or `t.*`")),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The names of a plain query's output columns (for SELECT DISTINCT's key).
fn output_names(items: &[SelectItem], at: Pos, what: &str) -> Result<Vec<Node>> {
    items
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(Expr::Identifier(id)) => {
                Ok(scalar(id.value.clone(), pos(id.span.start)))
            }
            SelectItem::ExprWithAlias { expr, alias } => {
                Ok(scalar(alias.value.clone(), located(expr, at)))
            }
            SelectItem::UnnamedExpr(e) => Err(SqlError::new(
                located(e, at),
                format!("name this column of {what}: `{e} AS name`"),
            )),
            _ => Err(unsupported(at, &format!("`*` in {what}; name the columns"))),
        })
        .collect()
}

fn stage(op: &str, value: Node, at: Pos) -> Node {
    map(vec![(scalar(op, at), value)], at)
}

fn expr_node(e: &Expr, fallback: Pos) -> Node {
    scalar_quoted(e.to_string(), located(e, fallback))
}

fn located(e: &Expr, fallback: Pos) -> Pos {
    match pos(e.span().start) {
        Pos::START => fallback,
        p => p,
    }
}

/// A one-part table name and its position.
fn object_name(name: &ObjectName) -> Result<(String, Pos)> {
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(id)] => Ok((id.value.clone(), pos(id.span.start))),
        _ => {
            let at = pos(name.span().start);
            Err(unsupported(
                at,
                &format!("the qualified name `{name}` (catalogs and databases)"),
            ))
        }
    }
}

/// A dotted name's text without quotes: `'parallelism.default'` is `parallelism.default`.
fn name_text(name: &ObjectName) -> String {
    name.0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(id) => id.value.clone(),
            other => other.to_string(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

fn unsupported(at: Pos, what: &str) -> SqlError {
    SqlError::new(at, format!("{what} is not supported yet by Sluice's SQL"))
}

/// The parser's message, at the position it names (`... at Line: 3, Column: 5`).
fn parser_error(e: ParserError) -> SqlError {
    let message = e.to_string();
    let located = message.rfind(" at Line: ").and_then(|i| {
        let rest = &message[i + " at Line: ".len()..];
        let (line, rest) = rest.split_once(", Column: ")?;
        let column: String = rest.chars().take_while(char::is_ascii_digit).collect();
        Some((i, line.trim().parse().ok()?, column.parse().ok()?))
    });
    match located {
        Some((i, line, column)) => SqlError::new(
            Pos { line, column },
            message[..i]
                .trim_start_matches("sql parser error: ")
                .to_owned(),
        ),
        None => SqlError::new(Pos::START, message),
    }
}

fn scalar(text: impl Into<String>, pos: Pos) -> Node {
    Node {
        value: Value::Scalar {
            text: text.into(),
            quoted: false,
        },
        pos,
    }
}

/// A string that is never read as a number or boolean (an expression).
fn scalar_quoted(text: String, pos: Pos) -> Node {
    Node {
        value: Value::Scalar { text, quoted: true },
        pos,
    }
}

fn map(entries: Vec<(Node, Node)>, pos: Pos) -> Node {
    Node {
        value: Value::Map(entries),
        pos,
    }
}

fn seq(items: Vec<Node>, pos: Pos) -> Node {
    Node {
        value: Value::Seq(items),
        pos,
    }
}

/// A mapping built by paths (`["state", "backend"]`), in the order keys are first put.
#[derive(Default)]
struct Section {
    entries: Vec<(String, Pos, Entry)>,
}

enum Entry {
    Leaf(Node),
    Nested(Section),
}

impl Section {
    fn put(&mut self, path: &[&str], value: Node) -> Result<()> {
        let Some((first, rest)) = path.split_first() else {
            return Ok(());
        };
        let at = value.pos;
        let Some(i) = self.entries.iter().position(|(k, _, _)| k == first) else {
            let entry = if rest.is_empty() {
                Entry::Leaf(value)
            } else {
                let mut nested = Section::default();
                nested.put(rest, value)?;
                Entry::Nested(nested)
            };
            self.entries.push(((*first).to_owned(), at, entry));
            return Ok(());
        };
        let entry = &mut self.entries[i].2;
        // An empty map put first (a connector with no options yet) takes options.
        if let Entry::Leaf(Node {
            value: Value::Map(m),
            ..
        }) = entry
            && m.is_empty()
            && !rest.is_empty()
        {
            *entry = Entry::Nested(Section::default());
        }
        match entry {
            Entry::Nested(nested) if !rest.is_empty() => nested.put(rest, value),
            _ => Err(SqlError::new(
                at,
                format!("`{}` is given twice", path.join(".")),
            )),
        }
    }

    fn into_node(self, pos: Pos) -> Node {
        let entries = self
            .entries
            .into_iter()
            .map(|(k, at, e)| {
                let value = match e {
                    Entry::Leaf(n) => n,
                    Entry::Nested(s) => s.into_node(at),
                };
                (scalar(k, at), value)
            })
            .collect();
        map(entries, pos)
    }
}
