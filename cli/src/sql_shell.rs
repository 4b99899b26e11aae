//! `sluice sql`: an interactive SQL shell over the same SQL front end as `.sql` job
//! files. The session keeps what defines (`SET`, `CREATE TABLE`, `CREATE VIEW`), each
//! checked when typed; `SHOW TABLES`, `DESCRIBE t` and `EXPLAIN ...` answer from it; a
//! `SELECT` runs on the embedded runtime and prints its rows as they come (Ctrl-C cancels
//! the query, not the shell); an `INSERT` runs its job there, or with `--coordinator` is
//! submitted to a cluster (`POST /v1/sql`).
//!
//! Statements end with `;`. On a terminal lines are edited with history (rustyline);
//! from a pipe they are read as they come, and the exit code says whether any failed.
//! Errors name the line and column within the statement typed, never the session's
//! hidden text. An updating query (a changelog: `GROUP BY` without a window, Top-N) on
//! a terminal shows its result as a table redrawn in place as it changes
//! (`live_table.rs`); through a pipe it prints the changes (`+I -U +U -D` in an `op`
//! column). The shell owns reading, session text and printing; planning and running are
//! the planner's and the embedded cluster's.

use std::io::{BufRead, IsTerminal};

use clap::Args;
use serde_json::json;
use sluice_planner::job_spec::JobSpecError;
use sluice_planner::sql::{Defined, parse_sql_job, sql_definitions};

use crate::cluster::client::{Credentials, call_any};
use crate::cluster::embedded::{self, RunOptions};
use crate::cluster::local_state::StateArgs;
use crate::{Failure, runtime};

/// The hidden sink a bare `SELECT` writes to (it prints rows as JSON lines).
const SHELL_SINK: &str = "__sluice_shell_output";

/// Arguments of `sluice sql`.
#[derive(Args)]
pub struct SqlArgs {
    /// Submit INSERTs to this coordinator (its REST API) instead of running them here.
    #[arg(long, env = "SLUICE_COORDINATOR")]
    coordinator: Option<String>,
    #[command(flatten)]
    credentials: Credentials,
    /// Worker processes per job: on this machine (0: in this process), or the
    /// coordinator's workers to use.
    #[arg(long)]
    workers: Option<u32>,
    #[command(flatten)]
    state: StateArgs,
}

/// What a statement typed into the shell asks for.
#[derive(Debug, PartialEq, Eq)]
enum Command<'a> {
    Quit,
    Help,
    ShowTables,
    Describe(&'a str),
    Explain,
    Query,
    Insert,
    Define,
}

/// Classifies `statement` (without its `;`) by its leading words.
fn classify(statement: &str) -> Command<'_> {
    let mut words = statement.split_whitespace();
    let first = words.next().unwrap_or("").to_ascii_uppercase();
    match first.as_str() {
        "QUIT" | "EXIT" | "\\Q" => Command::Quit,
        "HELP" | "\\?" => Command::Help,
        "SHOW"
            if words
                .next()
                .is_some_and(|w| w.eq_ignore_ascii_case("tables")) =>
        {
            Command::ShowTables
        }
        "DESCRIBE" | "DESC" => Command::Describe(words.next().unwrap_or("")),
        "EXPLAIN" => Command::Explain,
        "SELECT" | "WITH" | "VALUES" => Command::Query,
        "INSERT" => Command::Insert,
        _ => Command::Define,
    }
}

const HELP: &str = "\
statements end with `;`:
  SET 'key' = 'value';                  a job setting (e.g. 'parallelism.default')
  CREATE TABLE t (...) WITH (...);      a connector as a table (nexmark, file, kafka, print, ...)
  CREATE VIEW v AS SELECT ...;          a named query
  SHOW TABLES;  DESCRIBE t;             what the session defines, and a table's columns
  EXPLAIN SELECT ... | INSERT ...;      the job graph a query becomes
  SELECT ...;                           run it here, rows as they come (Ctrl-C cancels it);
                                        an updating result is a table redrawn in place
  INSERT INTO t SELECT ...;             run it as a job (on --coordinator when given)
  QUIT;";

/// The name the shell's hidden job text goes by in the planner's messages.
const FILE: &str = "shell.sql";

/// The session: what defines, as SQL text in the order typed, and the tables and views
/// that text creates (as the planner checked it when the last definition was added).
#[derive(Default)]
struct Session {
    definitions: Vec<String>,
    tables: Vec<Defined>,
}

impl Session {
    /// The session's definitions, then `prefix` and the `statement` typed on the next
    /// line, and where the statement sits in that text.
    fn with(&self, prefix: &str, statement: &str) -> (String, Placement) {
        let mut text = String::new();
        for d in &self.definitions {
            text.push_str(d);
            text.push_str(";\n");
        }
        let last = prefix.rsplit('\n').next().unwrap_or("");
        let placement = Placement {
            skip: (text.matches('\n').count() + prefix.matches('\n').count()) as u32,
            shift: last.chars().count() as u32,
            lines: statement.lines().count().max(1) as u32,
        };
        text.push_str(prefix);
        text.push_str(statement);
        (text, placement)
    }
}

/// Where the statement typed sits in the text the shell plans: after `skip` lines of
/// hidden text and `shift` hidden characters on its first line, over `lines` lines.
/// Errors are moved back into it; one in the hidden text is shown without a position.
#[derive(Debug, Clone, Copy)]
struct Placement {
    skip: u32,
    shift: u32,
    lines: u32,
}

impl Placement {
    fn at(self, line: u32, column: u32, message: &str) -> String {
        if line <= self.skip || line > self.skip + self.lines {
            return format!("error: {message}");
        }
        let line = line - self.skip;
        let column = if line == 1 {
            column.saturating_sub(self.shift).max(1)
        } else {
            column
        };
        format!("error at line {line}, column {column}: {message}")
    }

    fn spec(self, e: &JobSpecError) -> String {
        self.at(e.line, e.column, &e.message)
    }

    /// A planner or runtime message that starts `shell.sql:line:column: `.
    fn relocate(self, message: &str) -> String {
        let located = message.strip_prefix(FILE).and_then(|rest| {
            let mut parts = rest.strip_prefix(':')?.splitn(3, ':');
            let line = parts.next()?.parse().ok()?;
            let column = parts.next()?.parse().ok()?;
            Some(self.at(line, column, parts.next()?.trim_start()))
        });
        located.unwrap_or_else(|| format!("error: {message}"))
    }
}

/// A statement's outcome for the loop: printed, and counted when it failed.
type Outcome = Result<(), String>;

struct Shell {
    args: SqlArgs,
    session: Session,
    tokio: tokio::runtime::Runtime,
}

impl Shell {
    fn handle(&mut self, statement: &str) -> Outcome {
        match classify(statement) {
            Command::Quit => Ok(()),
            Command::Help => {
                println!("{HELP}");
                Ok(())
            }
            Command::ShowTables => {
                let tables = &self.session.tables;
                if tables.is_empty() {
                    println!("no tables yet: CREATE TABLE t (...) WITH ('connector' = ...);");
                }
                for t in tables {
                    match &t.connector {
                        Some(c) => println!("{}\ttable\t{c}", t.name),
                        None => println!("{}\tview", t.name),
                    }
                }
                Ok(())
            }
            Command::Describe(name) => self.describe(name.trim_end_matches(';')),
            Command::Explain => {
                // The word is blanked rather than cut so that columns stay where typed.
                let rest = format!("{}{}", " ".repeat(7), &statement.trim_start()[7..]);
                let (text, at) = match classify(&rest) {
                    Command::Query => self.query_text(&rest),
                    Command::Insert => self.session.with("", &rest),
                    _ => return Err("EXPLAIN takes a SELECT or an INSERT".to_owned()),
                };
                let plan = self.plan(&text, at)?;
                print!("{}", crate::explain::explain(&plan));
                Ok(())
            }
            Command::Query => {
                if self.args.coordinator.is_some() {
                    return Err("a SELECT shows its rows only when run here (without \
                         --coordinator); on a cluster INSERT INTO a table"
                        .to_owned());
                }
                let (text, at) = self.query_text(statement);
                let live = match std::io::stdout().is_terminal() {
                    true => self.updating_columns(&text, at)?,
                    false => None,
                };
                let Some(columns) = live else {
                    return self.run_here(&text, at, false);
                };
                let capture = crate::live_table::Capture::start(columns)
                    .map_err(|e| format!("error: capturing the query's output: {e}"))?;
                let outcome = self.run_here(&text, at, false);
                capture.finish();
                outcome
            }
            Command::Insert => {
                let (text, at) = self.session.with("", statement);
                match self.args.coordinator.clone() {
                    Some(url) => self.submit(&url, &text, at),
                    None => self.run_here(&text, at, true),
                }
            }
            Command::Define => {
                let (text, at) = self.session.with("", statement);
                let tables = sql_definitions(FILE, &text).map_err(|e| at.spec(&e))?;
                // A CREATE adds one at the end; a SET adds none.
                let created = tables.get(self.session.tables.len()).cloned();
                self.session.definitions.push(statement.to_owned());
                self.session.tables = tables;
                match created {
                    Some(t) if t.connector.is_some() => println!("table `{}` created", t.name),
                    Some(t) => println!("view `{}` created", t.name),
                    None => println!("set"),
                }
                Ok(())
            }
        }
    }

    /// The session's text with `select` written into the hidden printing sink.
    fn query_text(&self, select: &str) -> (String, Placement) {
        self.session.with(
            &format!(
                "CREATE TABLE {SHELL_SINK} WITH ('connector' = 'print');\nINSERT INTO {SHELL_SINK} "
            ),
            select,
        )
    }

    /// Plans `text` (a job) as `sluice explain` does.
    fn plan(
        &self,
        text: &str,
        at: Placement,
    ) -> Result<sluice_compute::plan::PhysicalPlan, String> {
        let graph = parse_sql_job(FILE, text).map_err(|e| at.spec(&e))?;
        self.tokio
            .block_on(sluice_compute::plan::plan(
                graph,
                sluice_connectors::Builtin::shared(),
            ))
            .map_err(|e| at.relocate(&e.to_string()))
    }

    /// What the sink of the query job `text` (the hidden printing table) writes.
    fn sink_schema(
        &self,
        text: &str,
        at: Placement,
    ) -> Result<arrow::datatypes::SchemaRef, String> {
        let plan = self.plan(text, at)?;
        let sink = plan
            .graph
            .nodes
            .iter()
            .find(|n| matches!(n.kind, Some(sluice_common::pb::node::Kind::Sink(_))))
            .map(|n| n.id)
            .ok_or("error: the query's plan has no sink")?;
        Ok(plan.input_schema(sink))
    }

    /// The columns (without `op`) of the query job `text` when its result is updating.
    fn updating_columns(&self, text: &str, at: Placement) -> Result<Option<Vec<String>>, String> {
        let schema = self.sink_schema(text, at)?;
        if !sluice_compute::changelog::is_changelog(&schema) {
            return Ok(None);
        }
        Ok(Some(
            schema
                .fields()
                .iter()
                .skip(1)
                .map(|f| f.name().clone())
                .collect(),
        ))
    }

    fn describe(&self, name: &str) -> Outcome {
        if name.is_empty() {
            return Err("DESCRIBE needs a table or view: DESCRIBE t;".to_owned());
        }
        let tables = &self.session.tables;
        let Some(t) = tables.iter().find(|t| t.name == name) else {
            let known: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
            return Err(format!(
                "no table or view `{name}`; the session has: {}",
                if known.is_empty() {
                    "none yet".to_owned()
                } else {
                    known.join(", ")
                }
            ));
        };
        let (text, at) = self.query_text(&format!("SELECT * FROM {}", t.name));
        for f in self.sink_schema(&text, at)?.fields() {
            let null = if f.is_nullable() { "" } else { " NOT NULL" };
            println!("{}\t{}{null}", f.name(), f.data_type());
        }
        Ok(())
    }

    /// Runs the job `text` on the embedded runtime until it ends or Ctrl-C cancels it.
    fn run_here(&self, text: &str, at: Placement, summary: bool) -> Outcome {
        let graph = parse_sql_job(FILE, text).map_err(|e| at.spec(&e))?;
        let cancel = tokio_util::sync::CancellationToken::new();
        let options = RunOptions {
            workers: self.args.workers.unwrap_or(0),
            progress: summary && std::io::stderr().is_terminal(),
            cancel: Some(cancel.clone()),
            ..RunOptions::default()
        };
        let result = self.tokio.block_on(async {
            let run = embedded::run(graph, &options, &self.args.state);
            tokio::pin!(run);
            tokio::select! {
                r = &mut run => r,
                _ = tokio::signal::ctrl_c() => {
                    cancel.cancel();
                    run.await
                }
            }
        });
        match result {
            Ok(s) => {
                if summary {
                    println!(
                        "{} records in, {} out, {:.2} s",
                        s.records_in, s.records_out, s.seconds
                    );
                }
                Ok(())
            }
            Err(_) if cancel.is_cancelled() => {
                eprintln!("query cancelled");
                Ok(())
            }
            Err(f) => Err(at.relocate(&f.message)),
        }
    }

    /// Submits the job `text` to the coordinator at `url` (`POST /v1/sql`).
    fn submit(&self, url: &str, text: &str, at: Placement) -> Outcome {
        // Planned here first, so that its mistakes point into the statement typed.
        self.plan(text, at)?;
        let body = json!({ "sql": text, "workers": self.args.workers });
        let answer = self
            .tokio
            .block_on(call_any(
                "POST",
                url,
                "/v1/sql",
                Some(body),
                &self.args.credentials,
            ))
            .map_err(|f| format!("error: {}", f.message))?;
        println!(
            "submitted job {}",
            answer["id"].as_str().unwrap_or("(no id in the answer)")
        );
        Ok(())
    }
}

/// Where a statement ends: a line whose code (outside `--` comments and quotes) ends
/// with `;`. Returns the statement without its `;`.
fn complete(buffer: &str) -> Option<&str> {
    let mut quote: Option<char> = None;
    let mut last_code = None;
    let mut chars = buffer.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '-') if chars.peek().is_some_and(|(_, n)| *n == '-') => {
                for (_, c) in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            (None, c) if !c.is_whitespace() => last_code = Some((i, c)),
            _ => {}
        }
    }
    match last_code {
        Some((i, ';')) if quote.is_none() => Some(&buffer[..i]),
        _ => None,
    }
}

/// What the input gave.
enum Read {
    Line(String),
    /// Ctrl-C at the prompt: what is typed of the statement is dropped.
    Dropped,
}

/// Lines from the terminal (edited, with history) or from a pipe.
enum Input {
    Terminal(Box<rustyline::DefaultEditor>, Option<std::path::PathBuf>),
    Pipe(std::io::StdinLock<'static>),
}

impl Input {
    fn open() -> Self {
        if std::io::stdin().is_terminal()
            && let Ok(mut editor) = rustyline::DefaultEditor::new()
        {
            let history = std::env::var_os("HOME")
                .map(|h| std::path::Path::new(&h).join(".cache/sluice/sql_history"));
            if let Some(h) = &history {
                let _ = editor.load_history(h);
            }
            return Input::Terminal(Box::new(editor), history);
        }
        Input::Pipe(std::io::stdin().lock())
    }

    /// The next line; `None` at the end of input (Ctrl-D).
    fn line(&mut self, continued: bool) -> Option<Read> {
        match self {
            Input::Terminal(editor, _) => {
                let prompt = if continued { "     -> " } else { "sluice> " };
                match editor.readline(prompt) {
                    Ok(line) => Some(Read::Line(line)),
                    Err(rustyline::error::ReadlineError::Interrupted) => Some(Read::Dropped),
                    Err(_) => None,
                }
            }
            Input::Pipe(stdin) => {
                let mut line = String::new();
                match stdin.read_line(&mut line) {
                    Ok(0) | Err(_) => None,
                    Ok(_) => Some(Read::Line(line)),
                }
            }
        }
    }

    fn remember(&mut self, statement: &str) {
        if let Input::Terminal(editor, Some(history)) = self {
            let _ = editor.add_history_entry(statement);
            if let Some(dir) = history.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = editor.save_history(history);
        }
    }
}

/// Runs `sluice sql`; fails (exit code 1) when a statement read from a pipe failed.
pub fn run(args: SqlArgs) -> Result<(), Failure> {
    let mut input = Input::open();
    let interactive = matches!(input, Input::Terminal(..));
    if interactive {
        eprintln!(
            "Sluice SQL shell: statements end with `;`; HELP; for what it takes, QUIT; to leave"
        );
    }
    let mut shell = Shell {
        args,
        session: Session::default(),
        tokio: runtime()?,
    };
    let mut buffer = String::new();
    let mut failed = 0usize;
    while let Some(read) = input.line(!buffer.trim().is_empty()) {
        let Read::Line(line) = read else {
            buffer.clear();
            continue;
        };
        buffer.push_str(line.trim_end_matches(['\n', '\r']));
        buffer.push('\n');
        let Some(statement) = complete(&buffer).map(str::to_owned) else {
            continue;
        };
        buffer.clear();
        let statement = statement.trim();
        if statement.is_empty() {
            continue;
        }
        input.remember(statement);
        if classify(statement) == Command::Quit {
            break;
        }
        if let Err(message) = shell.handle(statement) {
            eprintln!("{message}");
            failed += 1;
        }
    }
    if !buffer.trim().is_empty() {
        eprintln!(
            "error: the input ended inside a statement (no `;`): {}",
            buffer.trim()
        );
        failed += 1;
    }
    if failed > 0 && !interactive {
        return Err(Failure::from(anyhow::anyhow!(
            "{failed} statement(s) failed"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_ends_at_a_semicolon_outside_quotes_and_comments() {
        assert_eq!(complete("SELECT 1;\n"), Some("SELECT 1"));
        assert_eq!(complete("SELECT ';'\n"), None);
        assert_eq!(complete("SELECT 1 -- done;\n"), None);
        assert_eq!(complete("SELECT 1; -- done\n"), Some("SELECT 1"));
        assert_eq!(complete("SELECT\n  a;\n"), Some("SELECT\n  a"));
    }

    #[test]
    fn statements_are_told_apart_by_their_leading_words() {
        assert_eq!(classify("show tables"), Command::ShowTables);
        assert_eq!(classify("DESCRIBE bid"), Command::Describe("bid"));
        assert_eq!(classify("explain select 1"), Command::Explain);
        assert_eq!(classify("select * from bid"), Command::Query);
        assert_eq!(classify("INSERT INTO t SELECT 1"), Command::Insert);
        assert_eq!(classify("create table t with ()"), Command::Define);
        assert_eq!(classify("quit"), Command::Quit);
    }

    #[test]
    fn errors_point_into_the_statement_typed_not_the_session() {
        let session = Session {
            definitions: vec!["CREATE TABLE a WITH ()".into(), "SET 'x' = 'y'".into()],
            tables: Vec::new(),
        };
        let (text, at) = session.with(
            "CREATE TABLE o WITH ();\nINSERT INTO o ",
            "SELECT b\nFROM a",
        );
        assert!(text.ends_with("INSERT INTO o SELECT b\nFROM a"), "{text}");
        let line = |l: u32, c: u32| at.at(l, c, "no");
        assert_eq!(line(4, 22), "error at line 1, column 8: no");
        assert_eq!(line(5, 6), "error at line 2, column 6: no");
        assert_eq!(line(2, 1), "error: no");
        assert_eq!(
            at.relocate("shell.sql:5:6: select: unknown column"),
            "error at line 2, column 6: select: unknown column"
        );
        assert_eq!(at.relocate("the store is down"), "error: the store is down");
    }
}
