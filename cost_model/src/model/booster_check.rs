//! Checks a saved booster's JSON before XGBoost reads it. XGBoost trusts the trees it loads:
//! a child or parent index out of range (the fuzz test found `parents` of 21474836471) makes
//! it read out of bounds and crash the process. A model file is outside input, so every index
//! it holds is checked here against the tree it belongs to.

use serde_json::Value;

/// XGBoost's parent of the root node.
const NO_PARENT: i64 = 2_147_483_647;

/// The most nodes one tree may declare (far above what depth 20 needs).
const MAX_NODES: usize = 1 << 22;

/// `Ok` when every tree of `json` is a well-formed binary tree over `columns` features (the
/// model's row layout: a store's row or a program's).
pub(crate) fn check_booster(json: &str, columns: usize) -> Result<(), String> {
    let root: Value = serde_json::from_str(json).map_err(|e| format!("booster: {e}"))?;
    let learner = field(&root, "learner")?;
    let param = field(learner, "learner_model_param")?;
    if count(field(param, "num_feature")?)? != columns {
        return Err("booster: num_feature is not ours".into());
    }
    let model = field(field(learner, "gradient_booster")?, "model")?;
    let trees = array(field(model, "trees")?, "trees")?;
    let declared = count(field(field(model, "gbtree_model_param")?, "num_trees")?)?;
    let info = array(field(model, "tree_info")?, "tree_info")?;
    if declared != trees.len() || info.len() != trees.len() {
        return Err("booster: the tree count disagrees with its trees".into());
    }
    if info.iter().any(|v| v.as_i64() != Some(0)) {
        return Err("booster: tree_info names a class we do not have".into());
    }
    if let Some(indptr) = model.get("iteration_indptr") {
        let indptr = integers(indptr, "iteration_indptr")?;
        let rising = indptr.windows(2).all(|w| w[0] <= w[1]);
        if indptr.first() != Some(&0) || indptr.last() != Some(&(trees.len() as i64)) || !rising {
            return Err("booster: iteration_indptr does not cover the trees".into());
        }
    }
    for (i, tree) in trees.iter().enumerate() {
        check_tree(tree, columns).map_err(|e| format!("booster: tree {i}: {e}"))?;
    }
    Ok(())
}

/// One tree: every array as long as its node count, children after their parent (so no
/// cycles), parents that agree with the children, splits on features that exist.
fn check_tree(tree: &Value, columns: usize) -> Result<(), String> {
    let param = field(tree, "tree_param")?;
    let n = count(field(param, "num_nodes")?)?;
    if n == 0 || n > MAX_NODES {
        return Err(format!("{n} nodes"));
    }
    if count(field(param, "num_feature")?)? != columns
        || count(field(param, "num_deleted")?)? != 0
        || count(field(param, "size_leaf_vector")?)? > 1
    {
        return Err("tree_param is not one of ours".into());
    }
    let nodes = |name: &str| -> Result<Vec<i64>, String> {
        let v = integers(field(tree, name)?, name)?;
        if v.len() == n {
            Ok(v)
        } else {
            Err(format!("{name} has {} entries for {n} nodes", v.len()))
        }
    };
    let (left, right, parents) = (
        nodes("left_children")?,
        nodes("right_children")?,
        nodes("parents")?,
    );
    let (splits, types, default_left) = (
        nodes("split_indices")?,
        nodes("split_type")?,
        nodes("default_left")?,
    );
    for name in [
        "base_weights",
        "loss_changes",
        "split_conditions",
        "sum_hessian",
    ] {
        let values = array(field(tree, name)?, name)?;
        if values.len() != n
            || values
                .iter()
                .any(|v| !v.as_f64().is_some_and(f64::is_finite))
        {
            return Err(format!("{name} is not {n} finite numbers"));
        }
    }
    for name in [
        "categories",
        "categories_nodes",
        "categories_segments",
        "categories_sizes",
    ] {
        if tree
            .get(name)
            .is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty()))
        {
            return Err(format!("{name}: categorical splits are not ours"));
        }
    }
    if parents[0] != NO_PARENT {
        return Err("the root has a parent".into());
    }
    for i in 0..n {
        if types[i] != 0 || !(0..=1).contains(&default_left[i]) {
            return Err(format!("node {i} is not a numerical split"));
        }
        match (left[i], right[i]) {
            (-1, -1) => {}
            (l, r) => {
                for child in [l, r] {
                    let ok = usize::try_from(child).is_ok_and(|c| c > i && c < n);
                    if !ok || parents[child as usize] != i as i64 {
                        return Err(format!("node {i} has a bad child {child}"));
                    }
                }
                if l == r || !usize::try_from(splits[i]).is_ok_and(|f| f < columns) {
                    return Err(format!("node {i} splits badly"));
                }
            }
        }
    }
    // Every non-root node is some node's child (above), so the parents are all accounted for.
    Ok(())
}

fn field<'a>(v: &'a Value, name: &str) -> Result<&'a Value, String> {
    v.get(name).ok_or_else(|| format!("booster: no `{name}`"))
}

fn array<'a>(v: &'a Value, name: &str) -> Result<&'a Vec<Value>, String> {
    v.as_array()
        .ok_or_else(|| format!("`{name}` is not an array"))
}

fn integers(v: &Value, name: &str) -> Result<Vec<i64>, String> {
    array(v, name)?
        .iter()
        .map(|x| {
            x.as_i64()
                .ok_or_else(|| format!("`{name}` holds a non-integer"))
        })
        .collect()
}

/// XGBoost writes counts as decimal strings ("172"); numbers are taken too.
fn count(v: &Value) -> Result<usize, String> {
    let parsed = match v {
        Value::String(s) => s.parse::<usize>().ok(),
        Value::Number(n) => n.as_u64().and_then(|n| usize::try_from(n).ok()),
        _ => None,
    };
    parsed.ok_or_else(|| format!("`{v}` is not a count"))
}
