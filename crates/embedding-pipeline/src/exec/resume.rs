//! Resuming a campaign: a write into an existing Lance dataset embeds only the ids it does not hold yet.
//!
//! [`ResumeRule`] is an analyzer rule. For every `COPY … STORED AS LANCE` or `INSERT INTO` a Lance table
//! (unless `embed.restart`), it puts an anti-join against the dataset's id column under the projection
//! that calls `embed()`, so rows already written are dropped before they are embedded. EXPLAIN shows
//! the join. [`ExistingIds`] is the table it joins (read when the query executes), so the join is planned even when
//! the output does not exist yet: another run may create it between this plan and its execution, and its ids must
//! then be skipped too.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, Result};
use datafusion::logical_expr::{Distinct, Expr, JoinType, LogicalPlan, LogicalPlanBuilder, Projection};
use datafusion::optimizer::AnalyzerRule;

use super::existing_ids::ExistingIds;
use crate::lance::target::write_target;
use crate::options::EmbedOptions;

/// The analyzer rule described in the module docs.
#[derive(Debug, Default)]
pub struct ResumeRule;

impl AnalyzerRule for ResumeRule {
    fn name(&self) -> &str {
        "embedding_pipeline_resume"
    }

    fn analyze(&self, plan: LogicalPlan, config: &ConfigOptions) -> Result<LogicalPlan> {
        if let LogicalPlan::Analyze(_) = plan {
            // EXPLAIN ANALYZE runs the write: it resumes as the write itself would.
            return plan.map_children(|write| self.analyze(write, config).map(Transformed::yes)).map(|t| t.data);
        }
        let options = EmbedOptions::from_config(config);
        let Some(target) = write_target(&plan) else { return Ok(plan) };
        if options.restart {
            return Ok(plan);
        }
        let input = without_done_ids(target.input.as_ref().clone(), &target.uri, &options.id_column)?.plan;
        plan.with_new_exprs(plan.expressions(), vec![input])
    }
}

/// A write's input with the ids its output already holds dropped, and whether they are dropped before
/// `embed()` runs.
#[derive(Debug)]
pub struct WithoutDone {
    /// The rows left to write.
    pub plan: LogicalPlan,
    /// Why the done ids could only be dropped after `embed()` (the join is then on the output, so each id is
    /// still written once, but a resume would embed again what is done): `None` when every branch that calls
    /// `embed()` drops them first.
    pub after_embed: Option<String>,
    /// The volatile expression that chooses the write's rows (`ORDER BY random() LIMIT n`, `WHERE random() < 0.1`),
    /// if one does (see [`volatile_choice`]): a resume would choose other rows and add them to the ones written.
    pub chosen_by: Option<String>,
}

/// The volatile call (`random()`, `uuid()`) that decides which rows of `input` reach its output, if one does: in
/// a filter's predicate, the order a LIMIT keeps the first rows of, a join's keys, a grouping's keys, a window or a
/// DISTINCT, directly or through a column computed beneath (followed down through projections and aliases), in
/// the query or in one of its subqueries. Each run then chooses other rows. A volatile column the choices do not
/// read only rides along, and chooses nothing.
pub fn volatile_choice(input: &LogicalPlan) -> Option<String> {
    let mut found = None;
    // Infallible closure: `apply_with_subqueries` only returns its errors.
    let _ = input.apply_with_subqueries(|node| {
        found = choices(node).into_iter().find_map(|(e, over)| volatile_in(&e, &over));
        Ok(if found.is_some() { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    found
}

/// The expressions by which `node` chooses rows, each with the plans whose output it reads.
fn choices(node: &LogicalPlan) -> Vec<(Expr, Vec<&LogicalPlan>)> {
    fn keys(s: &datafusion::logical_expr::Sort) -> Vec<(Expr, Vec<&LogicalPlan>)> {
        s.expr.iter().map(|k| (k.expr.clone(), vec![s.input.as_ref()])).collect()
    }
    match node {
        LogicalPlan::Filter(f) => vec![(f.predicate.clone(), vec![f.input.as_ref()])],
        LogicalPlan::Sort(s) if s.fetch.is_some() => keys(s),
        // The order a LIMIT keeps: the sort under it, or under the projection that drops a sort column not shown.
        LogicalPlan::Limit(l) => match l.input.as_ref() {
            LogicalPlan::Sort(s) => keys(s),
            LogicalPlan::Projection(p) => match p.input.as_ref() {
                LogicalPlan::Sort(s) => keys(s),
                _ => Vec::new(),
            },
            _ => Vec::new(),
        },
        LogicalPlan::Join(j) => {
            node.expressions().into_iter().map(|e| (e, vec![j.left.as_ref(), j.right.as_ref()])).collect()
        }
        LogicalPlan::Aggregate(a) => a.group_expr.iter().map(|e| (e.clone(), vec![a.input.as_ref()])).collect(),
        LogicalPlan::Window(w) => w.window_expr.iter().map(|e| (e.clone(), vec![w.input.as_ref()])).collect(),
        LogicalPlan::Distinct(d) => {
            let input = d.input();
            input.schema().columns().into_iter().map(|c| (Expr::Column(c), vec![input.as_ref()])).collect()
        }
        _ => Vec::new(),
    }
}

/// The volatile call in `e`, or in a column `e` reads from one of `over` (the plans whose output it reads).
fn volatile_in(e: &Expr, over: &[&LogicalPlan]) -> Option<String> {
    let mut call = None;
    // Infallible closure.
    let _ = e.apply(|x| {
        call = x.is_volatile_node().then(|| x.to_string());
        Ok(if call.is_some() { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    call.or_else(|| {
        e.column_refs()
            .into_iter()
            .find_map(|c| over.iter().find(|p| p.schema().has_column(c)).and_then(|p| volatile_column(p, c)))
    })
}

/// The volatile call that computes column `c` of `plan`'s output, if one does.
fn volatile_column(plan: &LogicalPlan, c: &Column) -> Option<String> {
    let at = plan.schema().index_of_column(c).ok()?;
    let input_column = |input: &LogicalPlan, i: usize| {
        let (q, f) = input.schema().qualified_field(i);
        Column::new(q.cloned(), f.name())
    };
    match plan {
        LogicalPlan::Projection(p) => volatile_in(&p.expr[at], &[p.input.as_ref()]),
        LogicalPlan::SubqueryAlias(a) => volatile_column(&a.input, &input_column(&a.input, at)),
        LogicalPlan::Filter(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::Repartition(_)
        | LogicalPlan::Distinct(Distinct::All(_)) => volatile_column(plan.inputs()[0], c),
        LogicalPlan::Join(j) => [j.left.as_ref(), j.right.as_ref()]
            .into_iter()
            .find(|side| side.schema().has_column(c))
            .and_then(|side| volatile_column(side, c)),
        LogicalPlan::Union(u) => u.inputs.iter().find_map(|b| volatile_column(b, &input_column(b, at))),
        LogicalPlan::Aggregate(a) => {
            let exprs: Vec<&Expr> = a.group_expr.iter().chain(&a.aggr_expr).collect();
            exprs.get(at).and_then(|e| volatile_in(e, &[a.input.as_ref()]))
        }
        LogicalPlan::Window(w) => {
            let width = w.input.schema().fields().len();
            match at.checked_sub(width) {
                Some(i) => w.window_expr.get(i).and_then(|e| volatile_in(e, &[w.input.as_ref()])),
                None => volatile_column(&w.input, &input_column(&w.input, at)),
            }
        }
        _ => None,
    }
}

/// Drop the rows whose output id the dataset at `uri` already holds, in every branch that feeds the output,
/// under the projection that calls `embed()` there. The output's id is traced down through projections
/// (renamed or computed ids), aliases, filters, sorts, unions, DISTINCT, GROUP BY the id and the preserved side
/// of a join, and a `LIMIT` over an `embed()` projection is moved under it (the same rows are chosen, and only
/// they are embedded). Where the trace stops at an operator that would choose other rows if some were dropped
/// under it (a LIMIT it cannot move, a window, an aggregate not grouped by the id, an outer join), the ids are
/// dropped from the output itself and [`WithoutDone::after_embed`] says why: [`ExistingIds`] then refuses to
/// plan a write into a dataset that holds rows, before anything is embedded. Unchanged when the output has no
/// column `column` (the id check refuses that).
pub fn without_done_ids(input: LogicalPlan, uri: &str, column: &str) -> Result<WithoutDone> {
    let Some((qualifier, _)) = input.schema().iter().find(|(_, f)| f.name() == column) else {
        return Ok(WithoutDone { plan: input, after_embed: None, chosen_by: None });
    };
    let id = Expr::Column(Column::new(qualifier.cloned(), column));
    let chosen_by = volatile_choice(&input);
    let skip = Skip { uri, column, chosen_by: chosen_by.clone(), keep: None };
    match skip.push(input.clone(), id.clone())? {
        Pushed::Done(plan) => Ok(WithoutDone { plan: *plan, after_embed: None, chosen_by }),
        Pushed::Stopped(why) => {
            let plan = skip.anti_join(input, id, Some(why.clone()))?;
            Ok(WithoutDone { plan, after_embed: Some(why), chosen_by })
        }
    }
}

/// A write's input keeping only the rows whose output id, as text, is among `ids` (a plan of one text column named
/// `column`, under the name [`SAMPLE_IDS`]), dropped before `embed()` runs as [`without_done_ids`] drops done ones: a trial's sample
/// of a write it has no work list for. `Err(why)` where they could only be dropped after `embed()`.
pub fn only_ids(
    input: LogicalPlan,
    ids: LogicalPlan,
    column: &str,
) -> Result<std::result::Result<LogicalPlan, String>> {
    let Some((qualifier, _)) = input.schema().iter().find(|(_, f)| f.name() == column) else {
        return Ok(Err(format!("its output has no id column {column}")));
    };
    let id = Expr::Column(Column::new(qualifier.cloned(), column));
    let skip = Skip { uri: "", column, chosen_by: None, keep: Some(ids) };
    Ok(match skip.push(input, id)? {
        Pushed::Done(plan) => Ok(*plan),
        Pushed::Stopped(why) => Err(why),
    })
}

/// The name of the table of ids [`only_ids`] keeps.
pub const SAMPLE_IDS: &str = "__sample_ids";

/// Why a write cannot execute a plan of `pipeline plan`, whose work list holds the rows of one `embed()` call
/// keyed by the id column of that call's input: `None` when it can (one `embed()` call, and the output's id is
/// that column as it is).
pub fn unplannable(input: &LogicalPlan, column: &str) -> Result<Option<String>> {
    let skipped = without_done_ids(input.clone(), "", column)?;
    if let Some(why) = skipped.after_embed {
        return Ok(Some(why));
    }
    if let Some(what) = skipped.chosen_by {
        return Ok(Some(format!(
            "its rows are chosen by {what}, anew on every run (choose them by something that stays the same, e.g. \
             ORDER BY md5(id) LIMIT n)"
        )));
    }
    let mut keys = Vec::new();
    skipped.plan.apply(|node| {
        if let LogicalPlan::Join(j) = node
            && j.join_type == JoinType::RightAnti
            && let LogicalPlan::TableScan(scan) = j.left.as_ref()
            && scan.table_name.table() == "__done_ids"
        {
            keys.extend(j.on.iter().map(|(_, key)| key.clone()));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(match keys.as_slice() {
        [] => None, // no id column: the write's id check says so
        [Expr::Column(c)] if c.name == column => None,
        [key] => Some(format!("its id is computed ({key}), where a plan keys its work list by the input's {column}")),
        keys => Some(format!("it calls embed() in {} branches, where a plan orders one", keys.len())),
    })
}

/// What pushing the done-id join down a plan gave.
enum Pushed {
    /// The plan with the join under every `embed()`.
    Done(Box<LogicalPlan>),
    /// Why it cannot go under the `embed()` calls.
    Stopped(String),
}

/// The dataset whose ids a write skips.
struct Skip<'a> {
    uri: &'a str,
    column: &'a str,
    /// What chooses the write's rows anew on every run, if anything (see [`volatile_choice`]).
    chosen_by: Option<String>,
    /// The ids to keep instead (see [`only_ids`]): the rows are then joined with them, not with the done ones.
    keep: Option<LogicalPlan>,
}

impl Skip<'_> {
    /// `node` without the rows whose `id` (an expression over `node`'s output) is done, dropped before any
    /// `embed()` under `node` runs.
    fn push(&self, node: LogicalPlan, id: Expr) -> Result<Pushed> {
        if !plan_calls_embed(&node) {
            return Ok(Pushed::Done(Box::new(self.anti_join(node, id, None)?)));
        }
        let stop = |what: &str| Ok(Pushed::Stopped(format!("{what} lies between embed() and the output")));
        if let Some(lifted) = embed_above_limit(&node)? {
            return self.push(lifted, id);
        }
        match &node {
            LogicalPlan::Projection(p) => {
                if expr_calls_embed(&id) || id_refs_embed(&id, p)? {
                    return stop("an id computed from embed()");
                }
                let inner = through_projection(id.clone(), p)?;
                if inner.column_refs().is_empty() {
                    // A constant id (`SELECT 'a' AS id, embed('x')`): dropped over the projection, as it reads no row.
                    return Ok(Pushed::Done(Box::new(self.anti_join(node, id, None)?)));
                }
                self.rebuild(&node, vec![(0, inner)])
            }
            LogicalPlan::SubqueryAlias(a) => {
                let inner = by_position(id, &a.schema, a.input.schema())?;
                self.rebuild(&node, vec![(0, inner)])
            }
            LogicalPlan::Filter(_) | LogicalPlan::Repartition(_) | LogicalPlan::Distinct(Distinct::All(_)) => {
                self.rebuild(&node, vec![(0, id)])
            }
            LogicalPlan::Sort(s) if s.fetch.is_none() => self.rebuild(&node, vec![(0, id)]),
            LogicalPlan::Union(u) => {
                let branches = u
                    .inputs
                    .iter()
                    .enumerate()
                    .map(|(i, input)| Ok((i, by_position(id.clone(), &u.schema, input.schema())?)))
                    .collect::<Result<Vec<_>>>()?;
                self.rebuild(&node, branches)
            }
            LogicalPlan::Aggregate(a) => match grouped_by(&id, a) {
                Some(inner) => self.rebuild(&node, vec![(0, inner)]),
                None => stop("an aggregate not grouped by the id"),
            },
            LogicalPlan::Join(j) => {
                let cols = id.column_refs();
                let left = cols.iter().all(|c| j.left.schema().has_column(c));
                let right = cols.iter().all(|c| j.right.schema().has_column(c));
                use JoinType::*;
                let side = match j.join_type {
                    Inner | Left | LeftSemi | LeftAnti if left => 0,
                    Inner | Right | RightSemi | RightAnti if right => 1,
                    _ => return stop(&format!("a {} join that does not keep the id's rows", j.join_type)),
                };
                let other = if side == 0 { &j.right } else { &j.left };
                if plan_calls_embed(other) {
                    return stop("a join whose other side calls embed()");
                }
                self.rebuild(&node, vec![(side, id)])
            }
            LogicalPlan::Limit(_) | LogicalPlan::Sort(_) => stop("a LIMIT"),
            LogicalPlan::Window(_) => stop("a window function"),
            LogicalPlan::Distinct(Distinct::On(_)) => stop("DISTINCT ON"),
            other => stop(&format!("a {} node", other.display().to_string().split(':').next().unwrap_or("plan"))),
        }
    }

    /// `node` with each of its inputs `(i, id)` pushed into, the others as they were.
    fn rebuild(&self, node: &LogicalPlan, into: Vec<(usize, Expr)>) -> Result<Pushed> {
        let mut inputs: Vec<LogicalPlan> = node.inputs().into_iter().cloned().collect();
        for (i, id) in into {
            match self.push(inputs[i].clone(), id)? {
                Pushed::Done(p) => inputs[i] = *p,
                stopped => return Ok(stopped),
            }
        }
        Ok(Pushed::Done(Box::new(node.with_new_exprs(node.expressions(), inputs)?)))
    }

    /// `__done_ids RIGHT ANTI JOIN input ON __done_ids.id = <id over input>`: the hash join builds its table
    /// from the done ids (its left side) and streams the input through, so no more than the ids is held, and
    /// rows reach `embed()` as they are read.
    fn anti_join(&self, input: LogicalPlan, id: Expr, after_embed: Option<String>) -> Result<LogicalPlan> {
        use datafusion::logical_expr::ExprSchemable;
        if let Some(keep) = &self.keep {
            // The ids as text on both sides, as the trial read them: one key type whatever the id's.
            let kept = Expr::Column(Column::new(Some(SAMPLE_IDS), self.column));
            let id = datafusion::logical_expr::cast(id, datafusion::arrow::datatypes::DataType::Utf8);
            return LogicalPlanBuilder::from(keep.clone())
                .join_with_expr_keys(input, JoinType::RightSemi, (vec![kept], vec![id]), None)?
                .build();
        }
        let id_type = id.get_type(input.schema())?;
        let ids = ExistingIds::new(self.uri, self.column, id_type)
            .after_embed(after_embed)
            .chosen_by(self.chosen_by.clone())
            .scan_plan()?;
        let done = Expr::Column(Column::new(Some("__done_ids"), self.column));
        LogicalPlanBuilder::from(ids)
            .join_with_expr_keys(input, JoinType::RightAnti, (vec![done], vec![id]), None)?
            .build()
    }
}

/// `LIMIT n` (with or without `ORDER BY`) right over a projection that calls `embed()`, rewritten as the
/// projection over the LIMIT, so that only the rows kept are embedded, and a resume can drop done rows
/// between them. `None` when `node` is not that shape, or its ordering needs the vectors.
fn embed_above_limit(node: &LogicalPlan) -> Result<Option<LogicalPlan>> {
    // A LIMIT over a projection that calls no embed() itself (the one that drops an ORDER BY column the SELECT does
    // not show): the LIMIT goes under it first, as a projection keeps every row, and then under the embed().
    if let LogicalPlan::Limit(l) = node
        && let LogicalPlan::Projection(outer) = l.input.as_ref()
        && !outer.expr.iter().any(expr_calls_embed)
    {
        let limit = LogicalPlan::Limit(datafusion::logical_expr::Limit {
            skip: l.skip.clone(),
            fetch: l.fetch.clone(),
            input: Arc::clone(&outer.input),
        });
        return match embed_above_limit(&limit)? {
            Some(lifted) => {
                Ok(Some(LogicalPlan::Projection(Projection::try_new(outer.expr.clone(), Arc::new(lifted))?)))
            }
            None => Ok(None),
        };
    }
    let (limit, sort, projection) = match node {
        LogicalPlan::Limit(l) => match l.input.as_ref() {
            LogicalPlan::Sort(s) if s.fetch.is_none() => match s.input.as_ref() {
                LogicalPlan::Projection(p) => (Some(l), Some(s), p),
                _ => return Ok(None),
            },
            LogicalPlan::Projection(p) => (Some(l), None, p),
            _ => return Ok(None),
        },
        LogicalPlan::Sort(s) if s.fetch.is_some() => match s.input.as_ref() {
            LogicalPlan::Projection(p) => (None, Some(s), p),
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    if !projection.expr.iter().any(expr_calls_embed) || plan_calls_embed(&projection.input) {
        return Ok(None);
    }
    let mut below = projection.input.as_ref().clone();
    if let Some(s) = sort {
        let mut keys = Vec::with_capacity(s.expr.len());
        for key in &s.expr {
            if id_refs_embed(&key.expr, projection)? {
                return Ok(None); // ordered by a vector
            }
            keys.push(key.with_expr(through_projection(key.expr.clone(), projection)?));
        }
        below =
            LogicalPlan::Sort(datafusion::logical_expr::Sort { expr: keys, input: Arc::new(below), fetch: s.fetch });
    }
    if let Some(l) = limit {
        below = LogicalPlan::Limit(datafusion::logical_expr::Limit {
            skip: l.skip.clone(),
            fetch: l.fetch.clone(),
            input: Arc::new(below),
        });
    }
    Ok(Some(LogicalPlan::Projection(Projection::try_new(projection.expr.clone(), Arc::new(below))?)))
}

/// Whether `e`, over the output of `p`, reads a column that `p` computes with `embed()`.
fn id_refs_embed(e: &Expr, p: &Projection) -> Result<bool> {
    for c in e.column_refs() {
        let i = p.schema.index_of_column(c)?;
        if expr_calls_embed(&p.expr[i]) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `e`, over the output of projection `p`, written over `p`'s input.
fn through_projection(e: Expr, p: &Projection) -> Result<Expr> {
    e.transform(|x| match &x {
        Expr::Column(c) => {
            let i = p.schema.index_of_column(c)?;
            Ok(Transformed::yes(p.expr[i].clone().unalias_nested().data))
        }
        _ => Ok(Transformed::no(x)),
    })
    .map(|t| t.data)
}

/// `e`, over the columns of `from`, written over the columns of `to` at the same positions.
fn by_position(e: Expr, from: &DFSchema, to: &DFSchema) -> Result<Expr> {
    e.transform(|x| match &x {
        Expr::Column(c) => {
            let (q, f) = to.qualified_field(from.index_of_column(c)?);
            Ok(Transformed::yes(Expr::Column(Column::new(q.cloned(), f.name()))))
        }
        _ => Ok(Transformed::no(x)),
    })
    .map(|t| t.data)
}

/// The id over an aggregate's input, when the id (over its output) is one of its plain GROUP BY keys: then
/// dropping a done id under it drops its whole group and changes no other.
fn grouped_by(id: &Expr, a: &datafusion::logical_expr::Aggregate) -> Option<Expr> {
    let Expr::Column(c) = id else { return None };
    let i = a.schema.index_of_column(c).ok()?;
    let key = a.group_expr.get(i)?;
    (!matches!(key, Expr::GroupingSet(_))).then(|| key.clone().unalias_nested().data)
}

/// Whether any node of `plan` calls `embed()`.
fn plan_calls_embed(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply_with_subqueries(|node| {
        if node.expressions().iter().any(expr_calls_embed) {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

fn expr_calls_embed(e: &Expr) -> bool {
    let mut found = false;
    let _ = e.apply(|x| {
        if let Expr::ScalarFunction(f) = x
            && (f.name() == "embed" || f.name() == "embed_image")
        {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}
